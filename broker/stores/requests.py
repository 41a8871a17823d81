"""A person's requests: approvals of calls and questions (`ask_user`), kept in PostgreSQL
until answered, however long that takes.

A job whose every pending call waits for a person is parked: its status becomes
`waiting` and no process holds it. Parking and answering race, and neither may lose the
other: `park` sets `waiting` only while a request of the job is still pending, and `wake`
sets `running` only once none is; each side writes first and checks after, so whichever
comes second sees both writes, and only one of them resumes the job.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field

from broker.protocol import CallOutcome

Kind = Literal["approval", "question", "elicitation"]  # elicitation: an MCP server's
OnTimeout = Literal["deny", "cancel"]
# a person's answer: a question's text or choices, an elicitation's object (or its texts)
AnswerValue = str | list[str] | dict[str, Any]


class Question(BaseModel):
    """What `ask_user` asks: free text, or one (or several) of the choices."""

    question: str
    choices: list[str] = Field(default_factory=list)
    multi: bool = False


class PersonRequest(BaseModel):
    """One request, as the inbox and the clients show it."""

    id: str
    job_id: str
    kind: Kind
    turn: int
    call_id: str
    tool: str
    input: dict[str, Any]
    reason: str
    question: Question | None = None
    requested_schema: dict[str, Any] | None = None  # an elicitation's: what `answer` must be
    status: str  # pending, allow-once, allow-always, deny, answered, declined, timeout
    answer: Any = None
    answered_by: str = ""
    answered_admin: bool = False
    user_id: str = ""
    requested_at: datetime
    answered_at: datetime | None = None
    expires_at: datetime | None = None
    on_timeout: OnTimeout = "deny"
    chat_message: dict[str, str] | None = None  # {channel, chat, id} where it was asked


def options(request: PersonRequest) -> list[str]:
    """The answers a chat's buttons offer, in order."""
    if request.kind == "approval":
        return ["allow-once", "allow-always", "deny"]
    return list(request.question.choices) if request.question else []


# every column by name: a column added by a later migration while processes run must not
# change what their prepared statements return ("cached plan must not change result type")
COLUMNS = (
    "id, job_id, kind, turn, call_id, tool, input, reason, question, status, answer,"
    " answered_by, answered_admin, user_id, requested_at, answered_at, expires_at, on_timeout,"
    " chat_message, requested_schema"
)
OPEN = (
    "INSERT INTO approvals (id, job_id, turn, call_id, tool, input, reason, kind, question,"
    " expires_at, on_timeout, user_id, requested_schema)"
    " VALUES (%(id)s, %(job_id)s, %(turn)s, %(call_id)s, %(tool)s, %(input)s, %(reason)s,"
    " %(kind)s, %(question)s, CASE WHEN %(timeout_s)s::float8 > 0"
    "   THEN now() + make_interval(secs => %(timeout_s)s::float8) END,"
    " %(on_timeout)s, %(user_id)s, %(requested_schema)s)"
    " ON CONFLICT (job_id, turn, call_id) DO UPDATE SET job_id = EXCLUDED.job_id"
    f" RETURNING {COLUMNS}, (xmax = 0) AS created"
)
ANSWER = (
    "UPDATE approvals SET status = %(status)s, answer = %(answer)s, answered_by = %(by)s,"
    " answered_admin = %(admin)s, answered_at = now()"
    " WHERE id = %(id)s AND status = 'pending' RETURNING job_id"
)
PARK = (
    "UPDATE jobs SET status = 'waiting' WHERE id = %(job)s AND status = 'running'"
    " AND EXISTS (SELECT 1 FROM approvals WHERE job_id = %(job)s AND status = 'pending')"
    " RETURNING id"
)
WAKE = (
    "UPDATE jobs SET status = 'running' WHERE id = %(job)s AND status = 'waiting'"
    " AND NOT EXISTS (SELECT 1 FROM approvals WHERE job_id = %(job)s AND status = 'pending')"
    " RETURNING id"
)
SELECT_ONE = f"SELECT {COLUMNS} FROM approvals WHERE id = %s"
SELECT_PENDING = (
    f"SELECT {COLUMNS} FROM approvals WHERE status = 'pending'"
    " AND (%(user)s::text IS NULL OR user_id = %(user)s) ORDER BY requested_at LIMIT %(limit)s"
)
CLOSE_UNANSWERED = (
    "UPDATE approvals SET status = 'deny', answered_by = 'cancelled', answered_at = now()"
    " WHERE job_id = %s AND status = 'pending' RETURNING id"
)
SELECT_EXPIRED = (
    "SELECT a.id, a.job_id FROM approvals a JOIN jobs j ON j.id = a.job_id"
    " WHERE a.status = 'pending' AND a.expires_at < now() AND j.status = 'waiting'"
    " ORDER BY a.expires_at LIMIT 500"
)


# a parked turn's finished calls, kept in the durable ledger (the hot one in Redis lapses
# after `ledger_ttl_s`, and a person may answer later than that)
KEEP = (
    "UPDATE tool_calls t SET status = 'done', is_error = o.is_error, for_llm = o.for_llm,"
    " for_user = o.for_user, metadata = o.metadata, worker = o.worker, attempts = o.attempts,"
    " decision = o.decision, decided_by = o.decided_by, decision_reason = o.decision_reason,"
    " finished_at = to_timestamp(o.finished_at)"
    " FROM jsonb_to_recordset(%s::jsonb) AS o(job_id text, turn int, call_id text,"
    " is_error bool, for_llm text, for_user text, metadata jsonb, worker text, attempts int,"
    " decision text, decided_by text, decision_reason text, finished_at float8)"
    " WHERE t.job_id = o.job_id AND t.turn = o.turn AND t.call_id = o.call_id"
)
KEPT = (
    "SELECT call_id, job_id, turn, for_llm, for_user, is_error, metadata, queue, worker,"
    " attempts, decision, decided_by, decision_reason FROM tool_calls"
    " WHERE job_id = %s AND turn = %s AND status = 'done'"
)


def _request(row: dict[str, Any]) -> PersonRequest:
    return PersonRequest.model_validate({k: v for k, v in row.items() if k != "created"})


# -- the orchestrator's side (asynchronous) ---------------------------------------------------


async def open_request(
    pool: AsyncConnectionPool,
    request_id: str,
    job_id: str,
    turn: int,
    call_id: str,
    tool: str,
    call_input: dict[str, Any],
    reason: str,
    *,
    kind: Kind = "approval",
    question: Question | None = None,
    timeout_s: float = 0.0,
    on_timeout: OnTimeout = "deny",
    user_id: str = "",
) -> tuple[PersonRequest, bool]:
    """The call's request, opened now or (a resumed turn) found as it was; and whether it
    is new (a new one is announced, a found one was already)."""
    params = _open_params(
        request_id, job_id, turn, call_id, tool, call_input, reason, kind, question,
        timeout_s, on_timeout, user_id,
    )  # fmt: skip
    async with pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(OPEN, params)
        row = await cur.fetchone()
    assert row is not None  # an upsert returns its row
    return _request(row), bool(row["created"])


def _open_params(
    request_id: str,
    job_id: str,
    turn: int,
    call_id: str,
    tool: str,
    call_input: dict[str, Any],
    reason: str,
    kind: Kind,
    question: Question | None,
    timeout_s: float,
    on_timeout: OnTimeout,
    user_id: str,
    requested_schema: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": request_id,
        "job_id": job_id,
        "turn": turn,
        "call_id": call_id,
        "tool": tool,
        "input": Jsonb(call_input),
        "reason": reason,
        "kind": kind,
        "question": Jsonb(question.model_dump()) if question else None,
        "timeout_s": timeout_s,
        "on_timeout": on_timeout,
        "user_id": user_id,
        "requested_schema": Jsonb(requested_schema) if requested_schema is not None else None,
    }


async def find(pool: AsyncConnectionPool, request_id: str) -> PersonRequest | None:
    async with pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(SELECT_ONE, (request_id,))
        row = await cur.fetchone()
    return _request(row) if row else None


async def settle(
    pool: AsyncConnectionPool, request_id: str, status: str, by: str
) -> PersonRequest | None:
    """Close a request the orchestrator decided (its timeout) unless a person answered
    first; the request as it now stands."""
    async with pool.connection() as conn:
        await conn.execute(
            ANSWER, {"status": status, "answer": None, "by": by, "admin": False, "id": request_id}
        )
    return await find(pool, request_id)


async def keep_outcomes(pool: AsyncConnectionPool, outcomes: list[CallOutcome]) -> None:
    """The finished calls of a turn about to be parked, in the durable ledger."""
    if outcomes:
        rows = "[" + ",".join(o.model_dump_json() for o in outcomes) + "]"
        async with pool.connection() as conn:
            await conn.execute(KEEP, (rows,))


async def kept_outcomes(
    pool: AsyncConnectionPool, job_id: str, turn: int
) -> dict[str, CallOutcome]:
    """The calls of a resumed turn that finished before it was parked, by call id."""
    async with pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(KEPT, (job_id, turn))
        rows = await cur.fetchall()
    return {r["call_id"]: CallOutcome.model_validate(r) for r in rows}


async def park(pool: AsyncConnectionPool, job_id: str) -> bool:
    """The job waits, held by no process, if a request of it is still pending."""
    async with pool.connection() as conn:
        cur = await conn.execute(PARK, {"job": job_id})
        return await cur.fetchone() is not None


async def wake_async(pool: AsyncConnectionPool, job_id: str) -> bool:
    async with pool.connection() as conn:
        cur = await conn.execute(WAKE, {"job": job_id})
        return await cur.fetchone() is not None


async def expired(pool: AsyncConnectionPool) -> list[tuple[str, str]]:
    """(request, job) of parked jobs' requests past their time."""
    async with pool.connection() as conn:
        cur = await conn.execute(SELECT_EXPIRED)
        return [(row[0], row[1]) for row in await cur.fetchall()]


# -- the answering side (synchronous: the clients, the API) -----------------------------------


def request(conn: psycopg.Connection[Any], request_id: str) -> PersonRequest | None:
    row = conn.cursor(row_factory=dict_row).execute(SELECT_ONE, (request_id,)).fetchone()
    return _request(row) if row else None


def answer(
    conn: psycopg.Connection[Any],
    request_id: str,
    status: str,
    by: str,
    admin: bool,
    value: Any = None,
) -> bool:
    """Record a person's answer (the first one wins); whether this one did."""
    row = conn.execute(
        ANSWER,
        {
            "status": status,
            "answer": Jsonb(value) if value is not None else None,
            "by": by,
            "admin": admin,
            "id": request_id,
        },
    ).fetchone()
    return row is not None


class BadAnswer(ValueError):
    """An answer the question does not accept; the message says what it does."""


def given(request: PersonRequest, answer: str | list[str]) -> str | list[str]:
    """The answer as the question takes it: free text, one of its choices, or (multi) a
    list of them."""
    q = request.question or Question(question=request.reason)
    picked = [answer] if isinstance(answer, str) else list(answer)
    if not q.choices:
        text = answer if isinstance(answer, str) else ", ".join(answer)
        if not text.strip():
            raise BadAnswer("the answer is empty")
        return text
    unknown = [a for a in picked if a not in q.choices]
    if unknown or not picked or (len(picked) > 1 and not q.multi):
        many = "one or more" if q.multi else "one"
        raise BadAnswer(f"answer with {many} of: {', '.join(q.choices)}")
    return picked if q.multi else picked[0]


def set_chat_message(
    conn: psycopg.Connection[Any], request_id: str, channel: str, chat: str, message_id: str
) -> None:
    conn.execute(
        "UPDATE approvals SET chat_message = %s WHERE id = %s",
        (Jsonb({"channel": channel, "chat": chat, "id": message_id}), request_id),
    )


def by_chat_message(
    conn: psycopg.Connection[Any], channel: str, chat: str, message_id: str
) -> PersonRequest | None:
    """The request asked in this chat message (a reply to it answers it)."""
    row = (
        conn.cursor(row_factory=dict_row)
        .execute(
            f"SELECT {COLUMNS} FROM approvals WHERE chat_message IS NOT NULL"
            " AND chat_message->>'channel' = %s AND chat_message->>'chat' = %s"
            " AND chat_message->>'id' = %s",
            (channel, chat, message_id),
        )
        .fetchone()
    )
    return _request(row) if row else None


def close_unanswered(conn: psycopg.Connection[Any], job_id: str) -> bool:
    """Close a job's pending requests as denied (it is being cancelled); whether any was."""
    return bool(conn.execute(CLOSE_UNANSWERED, (job_id,)).fetchall())


def wake(conn: psycopg.Connection[Any], job_id: str) -> bool:
    """The parked job runs again once none of its requests is pending; whether this call
    is the one that woke it (it then queues the job's run)."""
    return conn.execute(WAKE, {"job": job_id}).fetchone() is not None


def pending(
    conn: psycopg.Connection[Any], user_id: str | None, limit: int = 200
) -> list[PersonRequest]:
    """Pending requests, oldest first: one user's, or (None: an admin) everyone's."""
    rows = (
        conn.cursor(row_factory=dict_row)
        .execute(SELECT_PENDING, {"user": user_id, "limit": limit})
        .fetchall()
    )
    return [_request(r) for r in rows]


# -- an MCP server's elicitation --------------------------------------------------------------


def open_elicitation(
    conn: psycopg.Connection[Any],
    request_id: str,
    job_id: str,
    turn: int,
    call_key: str,
    tool: str,
    message: str,
    requested_schema: dict[str, Any],
    timeout_s: float,
    user_id: str,
) -> PersonRequest:
    """A server's question during a call (`call_key`: the call's id and a counter), kept
    like any request until answered or its wait ends."""
    params = _open_params(
        request_id, job_id, turn, call_key, tool, {}, message, "elicitation",
        Question(question=message), timeout_s, "deny", user_id, requested_schema,
    )  # fmt: skip
    row = conn.cursor(row_factory=dict_row).execute(OPEN, params).fetchone()
    assert row is not None  # an upsert returns its row
    return _request(row)


def close(conn: psycopg.Connection[Any], request_id: str, status: str, by: str) -> PersonRequest:
    """Close a request nobody answered (its wait ended) unless a person answered first;
    the request as it now stands."""
    conn.execute(
        ANSWER, {"status": status, "answer": None, "by": by, "admin": False, "id": request_id}
    )
    found = request(conn, request_id)
    assert found is not None
    return found


TRUE, FALSE = {"true", "yes", "on", "1", "y"}, {"false", "no", "off", "0", "n", ""}


def _typed(value: Any, kind: str) -> Any:
    """A form's or a command line's text as the schema's primitive (else as it is: the
    check then says what is wrong)."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            return float(text)
    except ValueError:
        return value
    if kind == "boolean" and text.lower() in TRUE | FALSE:
        return text.lower() in TRUE
    return value


def _fields(schema: dict[str, Any]) -> str:
    required = set(schema.get("required") or [])
    props: dict[str, Any] = schema.get("properties") or {}
    return ", ".join(
        f"{name} ({p.get('type', 'any')}{', required' if name in required else ''})"
        for name, p in props.items()
    )


def content(request: PersonRequest, answer: Any) -> dict[str, Any]:
    """An elicitation's answer as the server's schema takes it: an object (or its JSON, or
    `name=value` texts, typed by the schema), checked with jsonschema."""
    from jsonschema import exceptions, validators

    schema = request.requested_schema or {"type": "object"}
    props: dict[str, Any] = schema.get("properties") or {}
    given: Any = answer
    if isinstance(answer, str) and answer.strip().startswith("{"):
        try:
            given = json.loads(answer)
        except ValueError as exc:
            raise BadAnswer(f"the answer is not valid JSON: {exc}") from None
    elif isinstance(answer, str | list) and all(isinstance(a, str) for a in answer):
        pairs = [answer] if isinstance(answer, str) else answer
        if not all("=" in p for p in pairs):
            raise BadAnswer(f"answer with a JSON object or name=value of: {_fields(schema)}")
        given = dict(p.split("=", 1) for p in pairs)
    if not isinstance(given, dict):
        raise BadAnswer(f"answer with an object of: {_fields(schema)}")
    typed = {k: _typed(v, str((props.get(k) or {}).get("type", ""))) for k, v in given.items()}
    error = exceptions.best_match(validators.validator_for(schema)(schema).iter_errors(typed))
    if error is not None:
        where = "/".join(map(str, error.absolute_path))
        raise BadAnswer(
            f"{where + ': ' if where else ''}{error.message}; the answer needs: {_fields(schema)}"
        )
    return typed
