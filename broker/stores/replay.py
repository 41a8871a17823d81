"""What a recorded job left, read again: its calls with their outcomes (the ledger), its
own messages, and a copy of its session up to a turn (a fork). Replays, forks and evals
read a job only through here; nothing else is the record of what happened (DESIGN)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from pydantic import BaseModel, Field

RECORDED_CALLS = (
    "SELECT turn, seq, call_id, name, input, status, is_error, for_llm, for_user, metadata,"
    " queue, worker, attempts, decision, decided_by, decision_reason FROM tool_calls"
    " WHERE job_id = %s ORDER BY turn, seq"
)
JOB_MESSAGES = "SELECT seq, role, content FROM messages WHERE job_id = %s ORDER BY seq"


class RecordedCall(BaseModel):
    """One row of the ledger: a call as the model made it, and what it answered."""

    turn: int
    seq: int  # its place in the turn
    call_id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)
    status: str = "done"
    is_error: bool = False
    for_llm: str = ""
    for_user: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    queue: str = ""
    worker: str = ""
    attempts: int = 0
    decision: str = ""
    decided_by: str = ""
    decision_reason: str = ""

    @property
    def content(self) -> str:
        """The call by what it asks: its tool and its input, canonical."""
        return content_key(self.name, self.input)

    @property
    def ran(self) -> bool:
        """Whether its outcome is a tool's answer: not a refusal, a stop, or a replay's
        blocked call (none of which say what running it gives)."""
        m = self.metadata
        return (
            self.status == "done"
            and not self.decision.startswith("deny:")
            and not m.get("cancelled")
            and not m.get("session_lost")
            and (m.get("replay") or {}).get("source") != "blocked"
        )


def content_key(name: str, input_: dict[str, Any]) -> str:
    return name + json.dumps(input_, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def recorded_calls(conn: psycopg.Connection[Any], job_id: str) -> list[RecordedCall]:
    rows = conn.execute(RECORDED_CALLS, (job_id,)).fetchall()
    return [RecordedCall.model_validate(dict(r)) for r in rows]


async def recorded_calls_async(pool: Any, job_id: str) -> list[RecordedCall]:
    from psycopg.rows import dict_row

    async with pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(RECORDED_CALLS, (job_id,))
        return [RecordedCall.model_validate(r) for r in await cur.fetchall()]


def job_messages(conn: psycopg.Connection[Any], job_id: str) -> list[dict[str, Any]]:
    """The messages a job added to its session, in order (a fork's copied ones too)."""
    return list(conn.execute(JOB_MESSAGES, (job_id,)).fetchall())


def session_messages(conn: psycopg.Connection[Any], job_id: str) -> list[dict[str, Any]]:
    """Every message of the job's session, in order, with the job that added it."""
    return list(
        conn.execute(
            "SELECT m.seq, m.role, m.content, m.job_id FROM messages m JOIN jobs j"
            " ON j.session_id = m.session_id WHERE j.id = %s ORDER BY m.seq",
            (job_id,),
        ).fetchall()
    )


def fork_point(messages: list[dict[str, Any]], job_id: str, turn: int) -> int:
    """The session's last message seq that a fork after the job's `turn` (1-based) keeps:
    the results of that turn's calls, or the turn itself when it made none. -1: no such
    turn (or its results were never stored)."""
    seen = 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or m["job_id"] != job_id:
            continue
        seen += 1
        if seen == turn:
            following = messages[i + 1] if i + 1 < len(messages) else None
            calls = (m["content"] or {}).get("tool_calls")
            if calls and following is not None and following["role"] == "tool":
                return int(following["seq"])
            return -1 if calls else int(m["seq"])
    return -1


def copy_session(
    conn: psycopg.Connection[Any],
    original: str,
    job_id: str,
    session_id: str,
    spec: dict[str, Any],
    user_id: str,
    agent_id: str,
    upto_seq: int,
    turns: int,
    message: str,
) -> None:
    """A new session and job whose transcript is the original session's up to `upto_seq`
    (marked as the new job's, so it goes on from there), its ledger rows of those turns
    copied, and `message` as the next user input: one transaction."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO sessions (id, agent_id, user_id) VALUES (%s, %s, %s)",
            (session_id, agent_id, user_id),
        )
        conn.execute(
            "INSERT INTO jobs (id, session_id, status, spec, forked_from, iterations)"
            " VALUES (%s, %s, 'queued', %s, %s, %s)",
            (job_id, session_id, Jsonb(spec), original, turns),
        )
        conn.execute(
            "INSERT INTO messages (session_id, seq, job_id, role, content)"
            " SELECT %s, m.seq, CASE WHEN m.job_id = j.id THEN %s ELSE m.job_id END, m.role,"
            " m.content FROM messages m JOIN jobs j ON j.session_id = m.session_id"
            " WHERE j.id = %s AND m.seq <= %s",
            (session_id, job_id, original, upto_seq),
        )
        conn.execute(
            "INSERT INTO tool_calls (job_id, turn, call_id, seq, name, input, status, is_error,"
            " for_llm, for_user, metadata, queue, worker, attempts, queued_at, finished_at,"
            " started_at, decision, decided_by, decision_reason)"
            " SELECT %s, turn, call_id, seq, name, input, status, is_error, for_llm, for_user,"
            " metadata, queue, worker, attempts, queued_at, finished_at, started_at, decision,"
            " decided_by, decision_reason FROM tool_calls WHERE job_id = %s AND turn < %s",
            (job_id, original, turns),
        )
        if message:
            conn.execute(
                "INSERT INTO messages (session_id, seq, job_id, role, content)"
                " VALUES (%s, %s, %s, 'user', %s)",
                (session_id, upto_seq + 1, job_id, Jsonb({"text": message})),
            )
