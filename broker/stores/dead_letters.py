"""The dead-letter store: where poison ends up instead of vanishing.

Two kinds land here, in PostgreSQL, with the reason and what was received: a call whose
process died on each of its `CLAWQ_MAX_DELIVERIES` deliveries (the model still gets its
error result), and a message a worker could not decode into an envelope. `retry` sends a
dead call again as it was, with a fresh deadline and its ledger entry cleared, once the
cause is fixed; its outcome goes to the ledger as any call's does. A call whose outcome
exists is never sent again: `outcome_found` looks everywhere one may be (the hot ledger,
the spools of live workers, the stored results); the abandonment itself does not count."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

import psycopg
import redis
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from broker import keys
from broker.protocol import CallEnvelope, CallOutcome
from broker.redis.presence import live_processes

COLUMNS = (
    "id, kind, reason, queue, task, tool, job_id, turn, call_id, envelope, raw, attempts,"
    " status, retried_at, created_at"
)


class DeadLetter(BaseModel):
    id: int
    kind: Literal["exhausted", "undecodable"]
    reason: str
    queue: str
    task: str
    tool: str
    job_id: str
    turn: int
    call_id: str
    envelope: dict[str, Any] | None
    raw: str
    attempts: int
    status: Literal["dead", "retried"]
    retried_at: datetime | None
    created_at: datetime


class DeadLetters:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def exhausted(
        self, envelope: CallEnvelope, queue: str, task: str, attempts: int, reason: str
    ) -> None:
        """A call that used up its deliveries (once per call, whoever finds it)."""
        self.conn.execute(
            "INSERT INTO dead_letters (kind, reason, queue, task, tool, job_id, turn, call_id,"
            " envelope, attempts) VALUES ('exhausted', %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (job_id, turn, call_id) WHERE kind = 'exhausted' DO UPDATE SET"
            " attempts = EXCLUDED.attempts, status = 'dead', reason = EXCLUDED.reason",
            (
                reason,
                queue,
                task,
                envelope.tool,
                envelope.job_id,
                envelope.turn,
                envelope.call_id,
                Jsonb(envelope.model_dump(mode="json")),
                attempts,
            ),
        )

    def undecodable(self, body: Any, queue: str, task: str, reason: str) -> None:
        raw = body if isinstance(body, str) else json.dumps(body, default=repr)
        self.conn.execute(
            "INSERT INTO dead_letters (kind, reason, queue, task, raw) VALUES"
            " ('undecodable', %s, %s, %s, %s)",
            (reason[:2000], queue, task, raw[:100_000]),
        )

    def list(self, limit: int = 50, status: str | None = None) -> list[DeadLetter]:
        where = "WHERE status = %s" if status else ""
        params: tuple[Any, ...] = (status, limit) if status else (limit,)
        rows = self.conn.execute(
            f"SELECT {COLUMNS} FROM dead_letters {where} ORDER BY id DESC LIMIT %s", params
        ).fetchall()
        return [DeadLetter.model_validate(r) for r in rows]

    def get(self, letter_id: int) -> DeadLetter | None:
        row = self.conn.execute(
            f"SELECT {COLUMNS} FROM dead_letters WHERE id = %s", (letter_id,)
        ).fetchone()
        return DeadLetter.model_validate(row) if row else None

    def mark_retried(self, letter_id: int) -> None:
        self.conn.execute(
            "UPDATE dead_letters SET status = 'retried', retried_at = now() WHERE id = %s",
            (letter_id,),
        )

    def purge(self, older_than_s: float | None = None) -> int:
        if older_than_s is None:
            return self.conn.execute("DELETE FROM dead_letters").rowcount
        return self.conn.execute(
            "DELETE FROM dead_letters WHERE created_at < now() - make_interval(secs => %s)",
            (older_than_s,),
        ).rowcount


def outcome_found(client: redis.Redis, conn: psycopg.Connection[Any], e: CallEnvelope) -> str:
    """Where an outcome of this call already is ('' when nowhere): a call that ran to its
    end must not run again. The error that abandoned it is not an outcome of its run.
    `conn` gives rows as dicts (a Store's)."""
    status, raw = client.hmget(keys.call(e.job_id, e.turn, e.call_id), ["status", "outcome"])
    if status == b"done" and raw:
        outcome = CallOutcome.model_validate_json(raw)
        if not outcome.metadata.get("abandoned"):
            return f"the ledger has its outcome (run by {outcome.worker})"
    held = f"{e.job_id}:{e.turn}:{e.call_id}"
    for proc in live_processes(client):
        if held in (proc.get("calls") or ()):
            return f"{proc.get('id')} holds it (running, or its outcome waits in a spool)"
    row = conn.execute(
        "SELECT status, worker, metadata FROM tool_calls WHERE job_id = %s AND turn = %s"
        " AND call_id = %s",
        (e.job_id, e.turn, e.call_id),
    ).fetchone()
    if row is not None and row["status"] == "done" and not row["metadata"].get("abandoned"):
        return f"its result is in the transcript (run by {row['worker']})"
    return ""
