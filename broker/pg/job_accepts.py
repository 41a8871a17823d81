"""The accepts of agent runs taken together: one statement per pass of the event loop.

An orchestrator takes up to its accept window of agent runs at once (a thousand when
thousands are queued), and each accept reads the job with its transcript and marks it
started. One statement and one commit per job cost the orchestrator a round trip and
PostgreSQL a commit each; the accepts handed in within one pass of the loop go as one
statement instead (broker/redis/batching.py), each caller getting its own row.

A job accepted twice in one pass (a message delivered again) is accepted again in a
statement after the first, as it would have been alone. A batch that fails on a row is
accepted again one job at a time, so only the accept at fault fails; a PostgreSQL that is
away fails the whole batch (each run is queued again, as a lone accept's was).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from broker import fastjson
from broker.pg.batches import each_result
from broker.redis.batching import PassBatcher

# What a lone accept did, for each row of the batch `b`: keep the chain (a given one if the
# job has none yet) and, when `start`, start a job that is not final and not a subagent
# (those start once they have a running slot). The jobs are found by their key (`= ANY`);
# the statement runs on connections whose plans never scan a table whole.
STARTS = (
    "b.start AND jobs.status IN ('queued', 'running')"
    " AND coalesce((jobs.spec->>'depth')::int, 0) = 0"
)
ACCEPT_BATCH = (
    "WITH b AS MATERIALIZED (SELECT * FROM jsonb_to_recordset(%(batch)s::jsonb)"
    " AS b(id text, chain jsonb, start bool, orchestrator text))"
    " UPDATE jobs SET chain = coalesce(jobs.chain, b.chain),"
    f" status = CASE WHEN {STARTS} THEN 'running' ELSE jobs.status END,"
    f" orchestrator = CASE WHEN {STARTS} THEN b.orchestrator ELSE jobs.orchestrator END,"
    f" started_at = CASE WHEN {STARTS} THEN coalesce(jobs.started_at, now())"
    " ELSE jobs.started_at END"
    " FROM b WHERE jobs.id = ANY(%(ids)s) AND jobs.id = b.id"
    " RETURNING jobs.id, jobs.session_id, jobs.status, jobs.spec, jobs.chain,"
    " (SELECT coalesce(json_agg(json_build_object('seq', m.seq, 'role', m.role,"
    "   'content', m.content, 'job_id', m.job_id) ORDER BY m.seq), '[]')"
    "   FROM messages m WHERE m.session_id = jobs.session_id) AS transcript"
)


class Accept(NamedTuple):
    """One job's accept by `orchestrator`: its chain kept when it has none (`chain`) and,
    when `start`, the job started."""

    job: str
    orchestrator: str
    chain: list[Any] | None = None
    start: bool = True

    def row(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "id": self.job,
            "start": self.start,
            "orchestrator": self.orchestrator,
        }
        if self.chain is not None:
            row["chain"] = self.chain
        return row


class JobAccepts(PassBatcher[Accept]):
    """Each accept's result is the job's row with its transcript, or None for a job that
    does not exist."""

    IN_FLIGHT = 2  # batches at once: one out, the next gathering

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        super().__init__(self.IN_FLIGHT)
        self.pool = pool

    async def accept(self, accept: Accept) -> dict[str, Any] | None:
        row: dict[str, Any] | None = await self.submit(accept)
        return row

    async def send(self, items: list[Accept]) -> list[Any]:
        results: list[Any] = [None] * len(items)
        todo = list(range(len(items)))
        while todo:  # a job twice in the batch: its second accept in the next statement
            seen: set[str] = set()
            now: list[int] = []
            later: list[int] = []
            for i in todo:
                (later if items[i].job in seen else now).append(i)
                seen.add(items[i].job)
            found = await each_result([items[i] for i in now], self._execute)
            for i, result in zip(now, found, strict=True):
                results[i] = result
            todo = later
        return results

    async def _execute(self, items: list[Accept]) -> list[dict[str, Any] | None]:
        params = {
            "batch": fastjson.dumps([item.row() for item in items]),
            "ids": [item.job for item in items],
        }
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(ACCEPT_BATCH, params)
            rows = {row["id"]: row for row in await cur.fetchall()}
        return [rows.get(item.job) for item in items]
