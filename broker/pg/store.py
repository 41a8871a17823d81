"""The PostgreSQL store: jobs, sessions, transcripts, the durable tool-call ledger.

`Store` is synchronous (client, CLI); `AsyncStore` serves the orchestrator's event loop.
Both run the same SQL; migrations are plain numbered SQL files applied under an advisory
lock, so any number of processes may start at once.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb, set_json_dumps
from psycopg_pool import AsyncConnectionPool
from psycopg_pool.base import AttemptWithBackoff

from broker import fastjson
from broker.errors import Unavailable
from broker.outage import check_connection, stale
from broker.pg import features as pg_features
from broker.pg.job_accepts import Accept, JobAccepts
from broker.pg.transcript_writes import Results, TranscriptWrites, Write
from broker.protocol import JobResult, JobSpec, ToolCallRecord

MIGRATION_LOCK = 7_415_922_001
# psycopg_pool doubles its pause between reconnection attempts without end (1, 2, 4, 8 s…):
# a PostgreSQL back after 10 s was used 5 s later. A second between tries, always.
AttemptWithBackoff.DELAY_BACKOFF = 1.0
IDLE = TransactionStatus.IDLE
CONNECT_TIMEOUT_S = 10  # an unreachable host fails a use, it does not hang it


class StoreNotReady(Unavailable):
    """The database has no clawq schema yet: the migrations have not run."""


INSERT_SESSION = (
    "INSERT INTO sessions (id, agent_id, user_id) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
)
INSERT_JOB = (
    "INSERT INTO jobs (id, session_id, status, spec, parent_id, root_id, parent_session,"
    " replay_of, forked_from) VALUES (%s, %s, 'queued', %s, nullif(%s, ''), nullif(%s, ''),"
    " nullif(%s, ''), %s, %s) ON CONFLICT (id) DO NOTHING"
)
SELECT_JOB = (
    "SELECT id, session_id, status, spec, final_text, error, iterations, chain FROM jobs"
    " WHERE id = %s"
)
SELECT_CHILDREN = (
    "SELECT id, spec->>'label' AS label, (spec->>'depth')::int AS depth, status, parent_id,"
    " final_text, error, archived_at IS NOT NULL AS archived, created_at FROM jobs"
    " WHERE parent_session = %s AND id = session_id ORDER BY created_at"
)
SELECT_DESCENDANTS = (
    "WITH RECURSIVE tree AS ("
    " SELECT * FROM jobs WHERE parent_id = %s"
    " UNION ALL SELECT j.* FROM jobs j JOIN tree t ON j.parent_id = t.id)"
    " SELECT id, spec->>'label' AS label, (spec->>'depth')::int AS depth, status, parent_id,"
    " final_text, error, archived_at IS NOT NULL AS archived FROM tree ORDER BY created_at"
)
START_JOB = (
    "UPDATE jobs SET status = 'running', orchestrator = %s,"
    " started_at = coalesce(started_at, now())"
    " WHERE id = %s AND status IN ('queued', 'running') RETURNING id"
)
SELECT_MESSAGES = (
    "SELECT seq, role, content, job_id FROM messages WHERE session_id = %s ORDER BY seq"
)
SELECT_APPROVAL = (  # by name: a later migration's column must not change a prepared plan
    "SELECT id, job_id, turn, call_id, tool, input, reason, status, answered_by,"
    " requested_at, answered_at FROM approvals WHERE id = %s"
)
INSERT_APPROVAL = (
    "INSERT INTO approvals (id, job_id, turn, call_id, tool, input, reason)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s)"
)
ANSWER_APPROVAL = (
    "UPDATE approvals SET status = %s, answered_by = %s, answered_at = now()"
    " WHERE id = %s AND status = 'pending'"
)
SELECT_GRANTS = (
    "SELECT rule FROM permission_grants WHERE user_id = %s AND agent_id = %s ORDER BY created_at"
)
INSERT_GRANT = (
    "INSERT INTO permission_grants (user_id, agent_id, rule, granted_by, job_id)"
    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
)
SELECT_CALLS = (
    "SELECT call_id, name, input, is_error, for_llm, queue, worker, attempts, decision,"
    " decided_by, extract(epoch FROM started_at) AS started_at,"
    " extract(epoch FROM finished_at) AS finished_at FROM tool_calls"
    " WHERE job_id = %s ORDER BY turn, seq"
)


def migrations() -> list[tuple[int, str]]:
    folder = resources.files("broker.pg") / "migrations"
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            found.append((int(entry.name.split("_", 1)[0]), entry.read_text()))
    return sorted(found)


def migrate(conn: psycopg.Connection[Any]) -> None:
    """Apply every migration not yet applied, once, whoever gets there first."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS clawq_migrations"
            " (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cur = conn.cursor(row_factory=tuple_row)
        done = {row[0] for row in cur.execute("SELECT version FROM clawq_migrations")}
        for version, sql in migrations():
            if version not in done:
                conn.execute(sql.encode())
                conn.execute("INSERT INTO clawq_migrations (version) VALUES (%s)", (version,))
        pg_features.install(conn)


def _job_params(job_id: str, session_id: str, spec: JobSpec) -> tuple[Any, ...]:
    return (
        job_id,
        session_id,
        Jsonb(spec.model_dump()),
        spec.parent_id,
        spec.root_id,
        spec.parent_session,
        spec.replay.job_id if spec.replay else None,
        spec.fork.job_id if spec.fork else None,
    )


class Store:
    """Synchronous access for the client, the CLI and the workers.

    A long-lived process keeps one; after a PostgreSQL restart its connection is dead, so
    `conn` hands out a live one: checked without a round trip (outage.stale), opened again
    when it is not. While PostgreSQL is away that open fails at once (OperationalError),
    and the next use tries again."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn = self._connect()

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(
            self.url, autocommit=True, row_factory=dict_row, connect_timeout=CONNECT_TIMEOUT_S
        )

    @property
    def conn(self) -> psycopg.Connection[Any]:
        c = self._conn
        if c.closed or c.broken or (c.info.transaction_status == IDLE and stale(c)):
            c.close()
            self._conn = c = self._connect()
        return c

    def close(self) -> None:
        self._conn.close()

    def migrate(self) -> None:
        migrate(self.conn)

    def create_job(self, job_id: str, session_id: str, spec: JobSpec, user_id: str = "") -> None:
        with self.conn.transaction():
            self.conn.execute(INSERT_SESSION, (session_id, spec.agent_id, user_id))
            self.conn.execute(INSERT_JOB, _job_params(job_id, session_id, spec))

    def job(self, job_id: str) -> dict[str, Any] | None:
        return self.conn.execute(SELECT_JOB, (job_id,)).fetchone()

    def children(self, parent_session: str) -> list[dict[str, Any]]:
        """The subagents spawned in a session, oldest first."""
        return self.conn.execute(SELECT_CHILDREN, (parent_session,)).fetchall()

    def descendants(self, job_id: str) -> list[dict[str, Any]]:
        """Every job spawned under `job_id`, at any depth, oldest first."""
        return self.conn.execute(SELECT_DESCENDANTS, (job_id,)).fetchall()

    def session_owner(self, session_id: str) -> str | None:
        """The user a session belongs to; None when there is no such session."""
        row = self.conn.execute("SELECT user_id FROM sessions WHERE id = %s", (session_id,))
        found = row.fetchone()
        return found["user_id"] if found else None

    def archive(self, job_id: str) -> None:
        self.conn.execute("UPDATE jobs SET archived_at = now() WHERE id = %s", (job_id,))

    def job_status(self, job_id: str) -> str | None:
        row = self.conn.execute(SELECT_JOB, (job_id,)).fetchone()
        return row["status"] if row else None

    def transcript(self, session_id: str, last: int) -> list[dict[str, Any]]:
        rows = self.conn.execute(
            "SELECT seq, role, content, job_id FROM messages WHERE session_id = %s"
            " ORDER BY seq DESC LIMIT %s",
            (session_id, last),
        ).fetchall()
        return list(reversed(rows))

    def sessions(self, agent_id: str, user_id: str, limit: int) -> list[dict[str, Any]]:
        """An agent's (and user's) sessions, newest first, with their latest job."""
        return self.conn.execute(
            "SELECT s.id, s.created_at, j.id AS job_id, j.status, j.iterations,"
            " left(j.spec->>'prompt', 80) AS prompt FROM sessions s"
            " JOIN LATERAL (SELECT * FROM jobs WHERE session_id = s.id"
            "   ORDER BY created_at DESC LIMIT 1) j ON true"
            " WHERE s.agent_id = %s AND s.user_id = %s ORDER BY s.created_at DESC LIMIT %s",
            (agent_id, user_id, limit),
        ).fetchall()

    def session_status(self, session_id: str) -> dict[str, Any] | None:
        return self.conn.execute(
            "SELECT s.id, s.agent_id, s.created_at,"
            " (SELECT count(*) FROM messages m WHERE m.session_id = s.id) AS messages,"
            " (SELECT count(*) FROM jobs j WHERE j.session_id = s.id) AS jobs,"
            " (SELECT count(*) FROM tool_calls c JOIN jobs j ON j.id = c.job_id"
            "   WHERE j.session_id = s.id) AS tool_calls"
            " FROM sessions s WHERE s.id = %s",
            (session_id,),
        ).fetchone()

    def approval(self, request_id: str) -> dict[str, Any] | None:
        return self.conn.execute(SELECT_APPROVAL, (request_id,)).fetchone()

    def grants(self, user_id: str, agent_id: str) -> list[str]:
        rows = self.conn.execute(SELECT_GRANTS, (user_id, agent_id)).fetchall()
        return [row["rule"] for row in rows]

    def job_result(self, job_id: str) -> JobResult | None:
        row = self.conn.execute(SELECT_JOB, (job_id,)).fetchone()
        if row is None:
            return None
        calls = [
            ToolCallRecord(
                id=c["call_id"],
                name=c["name"],
                input=c["input"],
                is_error=c["is_error"],
                output=c["for_llm"],
                queue=c["queue"],
                worker=c["worker"],
                attempts=c["attempts"],
                decision=c["decision"],
                decided_by=c["decided_by"],
                started_at=float(c["started_at"] or 0),
                finished_at=float(c["finished_at"] or 0),
            )
            for c in self.conn.execute(SELECT_CALLS, (job_id,)).fetchall()
        ]
        return JobResult(
            job_id=job_id,
            session_id=row["session_id"],
            status=row["status"],
            final_text=row["final_text"],
            error=row["error"],
            iterations=row["iterations"],
            tool_calls=calls,
        )


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    """JSON parameters (messages, inputs, outcomes) encoded by orjson."""
    set_json_dumps(fastjson.dumps_bytes, conn)


def async_pool(
    url: str, max_size: int, **options: Any
) -> AsyncConnectionPool[psycopg.AsyncConnection[tuple[Any, ...]]]:
    """A pool that throws away, at checkout, a connection PostgreSQL closed (a restart):
    no round trip, so it costs nothing while the database is up."""
    return AsyncConnectionPool(
        url,
        min_size=1,
        max_size=max_size,
        open=False,
        kwargs={"autocommit": True},
        check=check_connection,
        **options,
    )


def with_setting(url: str, name: str, value: str) -> str:
    """`url` with a server setting added to the options it names (a schema's search path
    is kept)."""
    params = conninfo_to_dict(url)
    params["options"] = f"{params.get('options') or ''} -c {name}={value}".strip()
    return make_conninfo("", **params)


class AsyncStore:
    """The orchestrator's pooled, non-blocking access.

    What a running job writes (its transcript: messages, results, its end) waits for a
    PostgreSQL that is away, up to `outage_s`, then fails (the job pauses and the recovery
    sweep resumes it). Connections PostgreSQL closed are thrown away, never used."""

    def __init__(self, url: str, max_size: int = 10, outage_s: float = 0.0) -> None:
        self.pool = async_pool(url, max_size, configure=_configure)
        # the batched statements (the transcript's writes, the accepts) have connections of
        # their own, a batch in flight on each: there each statement is planned once (a
        # plan made per write cost 0.5 ms), and reads every table by its key (a plan kept
        # from a new database's first seconds, its tables nearly empty, scanned them whole
        # on every write however large they grew). A storm of accepts waits there, not in
        # the pool's queue, where the running jobs' statements would wait behind it.
        generic = with_setting(url, "plan_cache_mode", "force_generic_plan")
        keyed = with_setting(generic, "enable_seqscan", "off")
        batched = TranscriptWrites.IN_FLIGHT + JobAccepts.IN_FLIGHT
        self.write_pool = async_pool(keyed, batched, configure=_configure)
        self.writes = TranscriptWrites(self.write_pool, outage_s=outage_s)
        self.accepts = JobAccepts(self.write_pool)

    async def open(self) -> None:
        await self.pool.open(wait=True)
        await self.write_pool.open(wait=True)

    async def close(self) -> None:
        await self.write_pool.close()
        await self.pool.close()

    async def job(self, job_id: str) -> dict[str, Any] | None:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(SELECT_JOB, (job_id,))
            return await cur.fetchone()

    async def create_job(self, job_id: str, session_id: str, spec: JobSpec) -> None:
        """A job in an existing session (idempotent: the same id is created once)."""
        async with self.pool.connection() as conn:
            await conn.execute(INSERT_JOB, _job_params(job_id, session_id, spec))

    async def latest_job(self, session_id: str) -> dict[str, Any] | None:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                "SELECT id, spec, status FROM jobs WHERE session_id = %s"
                " ORDER BY created_at DESC LIMIT 1",
                (session_id,),
            )
            return await cur.fetchone()

    async def save_chain(self, job_id: str, chain: list[Any]) -> None:
        """The rest of the job's task graph, kept from its first delivery."""
        async with self.pool.connection() as conn:
            await conn.execute(
                "UPDATE jobs SET chain = %s WHERE id = %s AND chain IS NULL", (Jsonb(chain), job_id)
            )

    async def unfinished_children(self, job_id: str) -> list[str]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT id FROM jobs WHERE parent_id = %s AND status IN ('queued', 'running')",
                (job_id,),
            )
            return [row[0] for row in await cur.fetchall()]

    async def archive_finished_children(self, older_than_s: float) -> list[tuple[str, str]]:
        """Mark children finished longer ago than that archived: (child, parent session)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE jobs SET archived_at = now() WHERE parent_session IS NOT NULL"
                " AND id = session_id AND archived_at IS NULL AND finished_at IS NOT NULL"
                " AND finished_at < now() - make_interval(secs => %s)"
                " RETURNING id, parent_session",
                (older_than_s,),
            )
            return [(row[0], row[1]) for row in await cur.fetchall()]

    async def accept_job(
        self, job_id: str, orchestrator_id: str, chain: list[Any] | None, start: bool = True
    ) -> dict[str, Any] | None:
        """The job with its session's transcript, its chain kept (a given one if it has
        none yet) and, when `start`, started unless it is final or a subagent; accepted
        with the others of this pass of the loop. None for an unknown job."""
        return await self.accepts.accept(Accept(job_id, orchestrator_id, chain, start))

    async def start_job(self, job_id: str, orchestrator_id: str) -> bool:
        async with self.pool.connection() as conn:
            cur = await conn.execute(START_JOB, (orchestrator_id, job_id))
            return (await cur.fetchone()) is not None

    async def orphan_candidates(self, among: list[str] | None = None) -> list[tuple[str, str]]:
        """(job, the orchestrator that started it) for running jobs, and taken subagents
        that have waited a while for a slot (their message is consumed: `chain` is set);
        those without a live lease are resumed by whoever sees them. `among`: only these
        (the sweep looks again at the few it means to resume: most finished meanwhile)."""
        only = " AND id = ANY(%s)" if among is not None else ""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT id, orchestrator FROM jobs WHERE (status = 'running' OR (status ="
                " 'queued' AND chain IS NOT NULL AND created_at < now() - interval '30 seconds'))"
                f"{only} ORDER BY created_at LIMIT 1000",
                (among,) if among is not None else None,
            )
            return [(row[0], row[1]) for row in await cur.fetchall()]

    async def transcript(self, session_id: str) -> list[dict[str, Any]]:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(SELECT_MESSAGES, (session_id,))
            return await cur.fetchall()

    async def append_message(
        self,
        session_id: str,
        job_id: str,
        seq: int,
        role: str,
        content: dict[str, Any],
        turn: int = 0,
        calls: list[tuple[str, str, dict[str, Any], str]] | None = None,
        iterations: int | None = None,
        results: Results | None = None,
    ) -> None:
        """One transcript message, the calls it queues and the turn count, after the
        previous turn's `results` if they are not stored yet: stored once this returns
        (with the other jobs' writes of the moment, in one statement)."""
        await self.writes.write(
            Write(session_id, job_id, seq, role, content, turn, calls, iterations, results)
        )

    async def record_outcomes(self, session_id: str, job_id: str, results: Results) -> None:
        """A turn's tool results (message and ledger rows), stored once this returns."""
        await self.writes.write(Write(session_id, job_id, results=results))

    async def create_approval(
        self,
        request_id: str,
        job_id: str,
        turn: int,
        call_id: str,
        tool: str,
        call_input: dict[str, Any],
        reason: str,
    ) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(
                INSERT_APPROVAL,
                (request_id, job_id, turn, call_id, tool, Jsonb(call_input), reason),
            )

    async def answer_approval(self, request_id: str, status: str, by: str) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(ANSWER_APPROVAL, (status, by, request_id))

    async def grants(self, user_id: str, agent_id: str) -> list[str]:
        """The allow-always rules one user gave one agent."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(SELECT_GRANTS, (user_id, agent_id))
            return [row[0] for row in await cur.fetchall()]

    async def add_grants(
        self, user_id: str, agent_id: str, rules: list[str], by: str, job_id: str
    ) -> None:
        async with self.pool.connection() as conn, conn.transaction():
            for rule in rules:
                await conn.execute(INSERT_GRANT, (user_id, agent_id, rule, by, job_id))

    async def finish_job(
        self, job_id: str, status: str, final_text: str, error: str, iterations: int
    ) -> None:
        """The job's end, stored once this returns (with the other jobs' writes)."""
        await self.writes.write(
            Write(
                "", job_id, iterations=iterations, status=status, final_text=final_text, error=error
            )
        )
