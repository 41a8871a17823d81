"""The dead-letter store: where poison ends up instead of vanishing.

Two kinds land here, in PostgreSQL, with the reason and what was received: a call whose
process died on each of its `CLAWQ_MAX_DELIVERIES` deliveries (the model still gets its
error result), and a message a worker could not decode into an envelope. `retry` sends a
dead call again as it was, with a fresh deadline and its ledger entry cleared, once the
cause is fixed; its outcome goes to the ledger as any call's does."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from broker.protocol import CallEnvelope

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
