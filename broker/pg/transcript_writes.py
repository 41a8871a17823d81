"""The transcript writes of concurrent jobs: one statement per pass of the event loop.

A turn writes the model's message, the calls it queues and the turn count, with the
previous turn's tool results (their message and ledger rows) when those wait for it; a
job's end writes its status. Each job awaits its write before it sends its calls with an
effect (a turn is stored before they go out; reads may start while the model streams),
and thousands of jobs write at once: the writes handed in within one pass of the loop go
to PostgreSQL as one statement, one transaction, one commit (broker/redis/batching.py).

A batch that fails on a row (a constraint, bad data) is written again one write at a
time, so only the write at fault fails. A PostgreSQL that is away (down, restarting) is
waited for, up to `outage_s`: every statement is idempotent (inserts do nothing on a
conflict), so a batch whose commit was lost with its connection is written again safely.
Past that the whole batch fails, and its jobs pause for the recovery sweep.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import psycopg
from psycopg_pool import AsyncConnectionPool

from broker import fastjson
from broker.outage import async_retrying, postgres_down
from broker.pg.batches import each_result
from broker.protocol import CallOutcome
from broker.redis.batching import PassBatcher

# `b` is the batch, one row per write. PostgreSQL keeps one plan per connection for it
# (broker/pg/store.py), made perhaps in a new database's first seconds, on nearly empty
# tables: a join made then scanned tool_calls whole on every write, however large it grew
# (bench (j): 6,000 rows a write at 2,000 jobs), and with its sequential scans forbidden,
# read all of a long job's calls. So no row is reached through a join: inserts and the
# results' upsert find theirs through their conflict arbiter, the primary key; the jobs
# through `= ANY` of the batch's jobs, by their key (sequential scans are forbidden).
WRITE_BATCH = (
    "WITH b AS MATERIALIZED (SELECT * FROM jsonb_to_recordset(%(batch)s::jsonb) AS b("
    " session text, job text, seq int, role text, content jsonb, turn int, calls jsonb,"
    " iterations int, r_seq int, r_turn int, r_content jsonb, outcomes jsonb, status text,"
    " final_text text, error text)),"
    # the previous turn's results: their message, and their calls' ledger rows (stored with
    # the turn, before the results: the upsert updates them; a call id the model repeated
    # in one turn has its first outcome kept, the one it ran)
    " r AS (INSERT INTO messages (session_id, seq, job_id, role, content)"
    " SELECT session, r_seq, job, 'tool', r_content FROM b WHERE r_seq IS NOT NULL"
    " ON CONFLICT (session_id, seq) DO NOTHING),"
    " f AS (INSERT INTO tool_calls AS t (job_id, turn, call_id, seq, name, input, status,"
    " is_error, for_llm, for_user, metadata, queue, worker, attempts, decision, decided_by,"
    " decision_reason, started_at, finished_at)"
    " SELECT DISTINCT ON (b.job, o.call_id) b.job, b.r_turn, o.call_id, 0, '', '{}', 'done',"
    " o.is_error, o.for_llm, o.for_user, o.metadata, coalesce(o.queue, ''), o.worker,"
    " o.attempts, o.decision, o.decided_by, o.decision_reason,"
    " to_timestamp(nullif(o.started_at, 0)), to_timestamp(o.finished_at)"
    " FROM b CROSS JOIN LATERAL ROWS FROM (jsonb_to_recordset(b.outcomes) AS (job_id text,"
    " turn int, call_id text, is_error bool, for_llm text, for_user text, metadata jsonb,"
    " queue text, worker text, attempts int, decision text, decided_by text,"
    " decision_reason text, started_at float8, finished_at float8)) WITH ORDINALITY"
    " AS o(job_id, turn, call_id, is_error, for_llm, for_user, metadata, queue, worker,"
    " attempts, decision, decided_by, decision_reason, started_at, finished_at, n)"
    " WHERE o.job_id = b.job AND o.turn = b.r_turn ORDER BY b.job, o.call_id, o.n"
    " ON CONFLICT (job_id, turn, call_id) DO UPDATE SET status = 'done',"
    " is_error = excluded.is_error, for_llm = excluded.for_llm, for_user = excluded.for_user,"
    " metadata = excluded.metadata, queue = coalesce(nullif(excluded.queue, ''), t.queue),"
    " worker = excluded.worker, attempts = excluded.attempts, decision = excluded.decision,"
    " decided_by = excluded.decided_by, decision_reason = excluded.decision_reason,"
    " started_at = excluded.started_at, finished_at = excluded.finished_at),"
    # the new message, the calls it queues, the turn count
    " m AS (INSERT INTO messages (session_id, seq, job_id, role, content)"
    " SELECT session, seq, job, role, content FROM b WHERE seq IS NOT NULL"
    " ON CONFLICT (session_id, seq) DO NOTHING),"
    " c AS (INSERT INTO tool_calls (job_id, turn, call_id, seq, name, input, status, queue)"
    " SELECT b.job, b.turn, c.id, c.seq, c.name, c.input, 'queued', c.queue"
    " FROM b CROSS JOIN LATERAL jsonb_to_recordset(b.calls) AS c(id text, seq int,"
    " name text, input jsonb, queue text) ON CONFLICT DO NOTHING),"
    # the turn count; at the job's end, its status too
    " i AS (UPDATE jobs SET iterations = coalesce(b.iterations, jobs.iterations),"
    " status = coalesce(b.status, jobs.status), final_text = coalesce(b.final_text,"
    " jobs.final_text), error = coalesce(b.error, jobs.error), finished_at = CASE"
    " WHEN b.status IS NULL THEN jobs.finished_at ELSE now() END FROM b"
    " WHERE jobs.id = ANY(%(jobs)s) AND jobs.id = b.job"
    " AND (b.iterations IS NOT NULL OR b.status IS NOT NULL))"
    " SELECT 1"
)


class Results(NamedTuple):
    """A turn's tool results as the transcript stores them: the tool message (at `seq`)
    and the outcomes of its calls, in the model's order."""

    seq: int
    content: dict[str, Any]
    outcomes: list[CallOutcome]

    @property
    def turn(self) -> int:
        return self.outcomes[0].turn if self.outcomes else 0


class Write(NamedTuple):
    """One job's write: a message (when `role`), and results that wait for it; or its end
    (when `status`)."""

    session: str
    job: str
    seq: int | None = None
    role: str = ""
    content: dict[str, Any] | None = None
    turn: int = 0
    calls: list[tuple[str, str, dict[str, Any], str]] | None = None
    iterations: int | None = None
    results: Results | None = None
    status: str | None = None
    final_text: str = ""
    error: str = ""

    def json(self) -> str:
        """This write as a row of the batch (outcomes as pydantic writes them)."""
        row: dict[str, Any] = {
            "session": self.session,
            "job": self.job,
            "iterations": self.iterations,
        }
        if self.role:
            row.update(seq=self.seq, role=self.role, content=self.content, turn=self.turn)
        if self.status is not None:
            row.update(status=self.status, final_text=self.final_text, error=self.error)
        if self.calls:
            row["calls"] = [
                {"id": c[0], "seq": n, "name": c[1], "input": c[2], "queue": c[3]}
                for n, c in enumerate(self.calls)
            ]
        outcomes = ""
        if (r := self.results) is not None:
            row.update(r_seq=r.seq, r_turn=r.turn, r_content=r.content)
            outcomes = ',"outcomes":[' + ",".join(o.model_dump_json() for o in r.outcomes) + "]"
        text = fastjson.dumps(row)
        return text[:-1] + outcomes + "}"


def batch_params(items: list[Write]) -> dict[str, Any]:
    """WRITE_BATCH's parameters: the rows, and the jobs they update."""
    return {
        "batch": "[" + ",".join(item.json() for item in items) + "]",
        "jobs": list({item.job for item in items}),
    }


class TranscriptWrites(PassBatcher[Write]):
    IN_FLIGHT = 2  # batches at once: one being written, the next gathering

    def __init__(self, pool: AsyncConnectionPool[Any], outage_s: float = 0.0) -> None:
        super().__init__(self.IN_FLIGHT)
        self.pool = pool
        self.outage_s = outage_s

    async def write(self, write: Write) -> None:
        await self.submit(write)

    async def send(self, items: list[Write]) -> list[Any]:
        return await each_result(items, self._written)

    async def _written(self, items: list[Write]) -> list[None]:
        await self._execute(items)
        return [None] * len(items)

    async def _execute(self, items: list[Write]) -> None:
        params = batch_params(items)
        try:  # the common case costs no retry machinery
            async with self.pool.connection() as conn:
                await conn.execute(WRITE_BATCH, params)
            return
        except psycopg.Error as exc:
            if not (self.outage_s and postgres_down(exc)):
                raise
        async for attempt in async_retrying("transcript write", self.outage_s, postgres_down):
            with attempt:
                async with self.pool.connection() as conn:
                    await conn.execute(WRITE_BATCH, params)
