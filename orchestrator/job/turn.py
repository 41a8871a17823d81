"""Executing one turn's tool calls, as they arrive (streamed) or all at once.

Calls are scheduled in model order with the partition rule: consecutive concurrency-safe
calls run together (at most `max_parallel_calls`), an unsafe call waits for everything
before it and everything after it waits for it. With a streaming model a call starts as
soon as its block is complete, before the reply has ended, if it only reads: a call with
an effect waits until the reply has ended and the turn is stored, so a turn is in the
transcript before any of its effects is sent (an orchestrator that dies mid-stream has the
model asked again, and only reads ran). When an exec fails, its still-running siblings are
stopped (the error cascade). Results are recorded once, in the model's order, each under
its original id.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from broker.protocol import CallOutcome
from orchestrator.calls.gate import Ready, Refused
from orchestrator.calls.pending import cancelled_outcome
from orchestrator.conversation import ToolCall

if TYPE_CHECKING:
    from orchestrator.job.calls import JobCalls


class TurnCalls:
    def __init__(self, run: JobCalls, turn: int) -> None:
        self.run = run
        self.turn = turn
        self.calls: list[ToolCall] = []
        self.outcomes: dict[int, CallOutcome] = {}
        self.seen: set[str] = set()
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.groups: dict[int, int] = {}  # call index → its parallel group
        self.group = 0
        self.last_unsafe: asyncio.Task[None] | None = None
        self.since_unsafe: list[asyncio.Task[None]] = []
        self.complete = False  # every call of the turn is known (the reply has ended)
        # held calls go on: sent once the turn is stored (finish), else answered unsent
        self.released = asyncio.Event()
        self.sent: set[int] = set()  # calls handed to dispatch

    async def add(self, call: ToolCall) -> None:
        """Check one call (the gate) and schedule it; returns without waiting for it."""
        index = len(self.calls)
        self.calls.append(call)
        checked = await self.run.gate.check(self.turn, call, self.seen)
        self.seen.add(call.id)
        if isinstance(checked, Refused):
            self.outcomes[index] = self.run.local_outcome(self.turn, call, checked)
            await self.run.emit_finished(call, self.outcomes[index])
            return
        if checked.tool.concurrency_safe(checked.args):
            before = [self.last_unsafe] if self.last_unsafe else []
            task = asyncio.ensure_future(self._after(before, index, checked, hold=False))
            self.since_unsafe.append(task)
        else:
            before = [t for t in (self.last_unsafe, *self.since_unsafe) if t]
            self.group += 1
            task = asyncio.ensure_future(self._after(before, index, checked, hold=True))
            self.last_unsafe, self.since_unsafe = task, []
            self.group += 1
        self.groups[index] = self.group
        self.tasks[index] = task

    async def _after(
        self, before: list[asyncio.Task[None]], index: int, ready: Ready, hold: bool
    ) -> None:
        if before:
            await asyncio.wait(before)
        if hold:
            await self.released.wait()
        if index in self.outcomes:  # stopped before it started
            return
        self.sent.add(index)
        outcome = await self.run.dispatch(self.turn, ready, index)
        self.outcomes.setdefault(index, outcome)
        # the turn's last call: its event goes out with the job's next round trip (the
        # next turn's start, or the job's end), right after the turn is recorded
        last = self.complete and all(t.done() for i, t in self.tasks.items() if i != index)
        await self.run.emit_finished(ready.call, outcome, now=not last)
        if (
            outcome.is_error
            and not outcome.decision.startswith("deny:")  # refused as it was sent: never ran
            and ready.tool.cascades_on_error
            and self.run.s.settings.exec_error_cascade
        ):
            siblings = [
                i
                for i, g in self.groups.items()
                if g == self.groups[index] and i != index and i not in self.outcomes
            ]
            await self.stop(siblings, f"cancelled because {ready.tool.summary(ready.args)} failed")

    async def stop(self, indexes: list[int], reason: str) -> None:
        """Stop these calls: their workers are told, their waiters answered now."""
        if not indexes:
            return
        run = self.run
        async with run.s.redis.pipeline(transaction=False) as pipe:
            for i in indexes:
                pipe.set(
                    run.cancel_key(self.turn, self.calls[i].id),
                    reason,
                    ex=run.s.settings.events_ttl_s,
                )
            await pipe.execute()
        for i in indexes:
            self.outcomes.setdefault(
                i, cancelled_outcome(run.job_id, self.turn, self.calls[i].id, reason)
            )
            run.s.dispatcher.resolve_cancelled(run.job_id, self.turn, self.calls[i].id, reason)

    async def stop_all(self, reason: str) -> None:
        await self.stop([i for i in range(len(self.calls)) if i not in self.outcomes], reason)
        self.released.set()  # every call has its outcome: what was held returns unsent

    def cut(self) -> None:
        """The reply broke off before the turn was stored: the calls held for its end
        never go (nothing records them; the model is asked again)."""
        reason = "not run: the model's reply broke off"
        for i, call in enumerate(self.calls):
            if i not in self.sent:
                self.outcomes.setdefault(
                    i, cancelled_outcome(self.run.job_id, self.turn, call.id, reason)
                )
        self.released.set()

    async def finish(self, calls: list[ToolCall]) -> None:
        """Schedule any call the stream did not deliver, wait for all, record in order."""
        for call in calls[len(self.calls) :]:
            await self.add(call)
        self.complete = True
        self.released.set()  # the caller stored the turn before it asked for its end
        if self.tasks:
            await asyncio.wait(self.tasks.values())
        for task in self.tasks.values():
            task.result()  # a bug in dispatch surfaces here, not silently
        await self.run.record(self.turn, self.calls, self.outcomes)
