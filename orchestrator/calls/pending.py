"""A call on its way: what the dispatcher keeps of it while its job waits, and the outcomes
the orchestrator gives in a worker's place (cancelled, its session lost)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from broker.protocol import CallEnvelope, CallOutcome


def cancelled_outcome(job_id: str, turn: int, call_id: str, reason: str) -> CallOutcome:
    return CallOutcome(
        call_id=call_id,
        job_id=job_id,
        turn=turn,
        for_llm=f"not completed: {reason}",
        is_error=True,
        worker="orchestrator",
        attempts=0,
        metadata={"cancelled": True},
    )


def session_lost(e: CallEnvelope, proc: str, began: bool = False) -> CallOutcome:
    """A pinned call's answer when the process holding its session's state is gone."""
    what = "was cut short" if began else "was not run"
    reason = (
        f"{e.tool} {what}: the session's {e.tool} state lived in worker process {proc}, "
        "which stopped, and it is lost; start a new one (e.g. navigate or start again)"
    )
    return CallOutcome(
        call_id=e.call_id,
        job_id=e.job_id,
        turn=e.turn,
        for_llm=reason,
        for_user=reason,
        is_error=True,
        worker="orchestrator",
        attempts=0,
        metadata={"session_lost": True},
    )


@dataclass
class Pending:
    envelope: CallEnvelope
    queue: str
    future: asyncio.Future[CallOutcome]
    pinned: str = ""  # the process the call was routed to (its session's state lives there)
    raw: str = ""  # the message as sent (looked for in its queue)
    resent_for: set[str] = field(default_factory=set)
    sent_at: float = field(default_factory=time.monotonic)
    looked_at: float = 0.0  # last time it was looked for in its queue
    told_waiting: bool = False  # tool_call_waiting was emitted
    # when last looked for: gone from its queue and held by a live process (taken, and a
    # read may run before its claim), or not; None: not looked for yet
    held: bool | None = None
    unheld: bool = False  # found gone and held by nobody once: lost if found so again
    # sent while its turn was being stored (CallEnvelope.gate), which it is not yet: taken
    # and dropped unclaimed is not lost (its worker found no stored turn) until it is
    shut: bool = False


def call_field(e: CallEnvelope) -> str:
    return f"{e.job_id}:{e.turn}:{e.call_id}"
