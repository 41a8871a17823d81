"""The message outbox: one row per `message` call, keyed by job and call id, so a call
that Celery delivers again never sends twice.

A send first claims its row (`sending`), then contacts the provider, then records the
provider's message id (`sent`) or its refusal (`failed`). A delivery that finds its row:
`sent` returns the first send's id and sends nothing; `failed` may send again (the
provider said no, so nothing went out); `sending` means an earlier attempt died while the
provider had the message, so whether it arrived is unknown: it is marked `unknown` and not
sent again, because a duplicate in somebody's chat cannot be taken back.

Each row names the job and session that sent it: an edit acts only on a message that its
own job or session sent (`sent_by`), never on one another session's call returned."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import psycopg
from pydantic import BaseModel

Status = Literal["sending", "sent", "failed", "unknown"]


class OutboxRow(BaseModel):
    key: str
    job_id: str
    session_id: str = ""
    channel: str
    target: str
    action: str
    status: Status
    attempts: int
    provider_id: str
    error: str
    forward_reason: str
    created_at: datetime
    sent_at: datetime | None = None


COLUMNS = (
    "key, job_id, session_id, channel, target, action, status, attempts, provider_id, error,"
    " forward_reason, created_at, sent_at"
)


class Claim(BaseModel):
    """What a delivery of a call may do: `send` (the row is ours, `sending`), or return
    what an earlier delivery did (`row`: sent, or unknown)."""

    send: bool
    row: OutboxRow


class Outbox:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def claim(
        self,
        key: str,
        job_id: str,
        channel: str,
        target: str,
        action: str,
        reason: str = "",
        session_id: str = "",
    ) -> Claim:
        with self.conn.transaction():
            row = self.conn.execute(
                "INSERT INTO message_outbox (key, job_id, session_id, channel, target, action,"
                " status, forward_reason) VALUES (%s, %s, %s, %s, %s, %s, 'sending', %s)"
                f" ON CONFLICT (key) DO NOTHING RETURNING {COLUMNS}",
                (key, job_id, session_id, channel, target, action, reason),
            ).fetchone()
            if row is not None:
                return Claim(send=True, row=OutboxRow.model_validate(row))
            found = self.conn.execute(
                f"SELECT {COLUMNS} FROM message_outbox WHERE key = %s FOR UPDATE", (key,)
            ).fetchone()
            assert found is not None
            before = OutboxRow.model_validate(found)
            if before.status == "sent" or before.status == "unknown":
                return Claim(send=False, row=before)
            status = "sending" if before.status == "failed" else "unknown"
            row = self.conn.execute(
                "UPDATE message_outbox SET status = %s, attempts = attempts + 1 WHERE key = %s"
                f" RETURNING {COLUMNS}",
                (status, key),
            ).fetchone()
            return Claim(send=status == "sending", row=OutboxRow.model_validate(row))

    def sent(self, key: str, provider_id: str) -> None:
        self.conn.execute(
            "UPDATE message_outbox SET status = 'sent', provider_id = %s, error = '',"
            " sent_at = now() WHERE key = %s",
            (provider_id, key),
        )

    def failed(self, key: str, error: str, outcome_known: bool = True) -> None:
        """The provider refused (`failed`: nothing went out), or the outcome is not known
        (`unknown`: it may have gone out)."""
        self.conn.execute(
            "UPDATE message_outbox SET status = %s, error = %s WHERE key = %s",
            ("failed" if outcome_known else "unknown", error[:2000], key),
        )

    def get(self, key: str) -> OutboxRow | None:
        row = self.conn.execute(
            f"SELECT {COLUMNS} FROM message_outbox WHERE key = %s", (key,)
        ).fetchone()
        return OutboxRow.model_validate(row) if row else None

    def sent_by(
        self, channel: str, target: str, provider_id: str, job_id: str, session_id: str
    ) -> OutboxRow | None:
        """The send that delivered message `provider_id` to `channel:target`, if this job
        or this session made it (None otherwise: another session's message, a note, or no
        message at all). Provider ids are per chat (Telegram's count up in each), hence
        the target."""
        row = self.conn.execute(
            f"SELECT {COLUMNS} FROM message_outbox WHERE channel = %s AND provider_id = %s"
            " AND target = %s AND action = 'send' AND status = 'sent'"
            " AND (job_id = %s OR (session_id <> '' AND session_id = %s))"
            " ORDER BY created_at LIMIT 1",
            (channel, provider_id, target, job_id, session_id),
        ).fetchone()
        return OutboxRow.model_validate(row) if row else None
