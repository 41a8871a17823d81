"""Executing one turn's tool calls, as they arrive (streamed) or all at once.

Calls are scheduled in model order with the partition rule: consecutive concurrency-safe
calls run together (at most `max_parallel_calls`), an unsafe call waits for everything
before it and everything after it waits for it. With a streaming model a call starts as
soon as its block is complete, before the reply has ended, if it only reads: a call with
an effect waits until the reply has ended and the turn is stored, so a turn is in the
transcript before any of its effects acts (an orchestrator that dies mid-stream has the
model asked again, and only reads ran). A call whose worker waits for its claim before it
acts (`Tool.waits_for_claim`: a file's write, which stores its checkpoint meanwhile) is
sent as the turn's write goes out, gated: its worker claims it once the write has
committed and the turn's gate opens (workers/outcomes.py, `Claiming.opened`). A read of
the transcript itself waits for the write: it sees the turn and every result before it
(they are written with the turn). A turn of reads alone goes on while it is written
(`reads_only`): nothing of it waits for the write, and the job's next write waits for it.
When an exec fails, its still-running siblings are stopped (the error cascade). Results
are recorded once, in the model's order, each under its original id.

A call that needs a person (an approval, a question) asks once the turn is stored, and
waits in memory for up to `park_after_s`; once nothing else of the turn runs, the turn
parks the job (JobParked): the job leaves memory and whoever answers the last request
queues it again, to be resumed from its transcript like any other.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis

from broker import keys
from broker.errors import Signal
from broker.protocol import CallOutcome
from broker.stores import requests
from broker.stores.requests import PersonRequest
from orchestrator.calls.gate import Ready, Refused
from orchestrator.calls.pending import cancelled_outcome
from orchestrator.conversation import Message, ToolCall

if TYPE_CHECKING:
    from orchestrator.job.calls import JobCalls


log = logging.getLogger("clawq.loop")


class JobParked(Signal):
    """Every call left of the turn waits for a person: the job leaves memory, `waiting`."""


PARK_RETRY_S = 0.25  # a turn not idle yet is looked at again this soon


class Flag:
    """asyncio.Event's behaviour with its waiters in a list: an Event's deque is 0.75 KB
    before anyone waits, a turn has three, and 10,000 jobs run at once (bench (j)); and a
    waiter can be a bare future, waited on beside other tasks without a task of its own."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] = []

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    def waiter(self) -> asyncio.Future[None]:
        """A future done once the flag is set; `forget` it when no longer waited on."""
        waiter = asyncio.get_running_loop().create_future()
        if self._set:
            waiter.set_result(None)
        else:
            self._waiters.append(waiter)
        return waiter

    def awaited(self) -> bool:
        return bool(self._waiters)

    def forget(self, waiter: asyncio.Future[None]) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)

    async def wait(self) -> None:
        if self._set:
            return
        waiter = self.waiter()
        try:
            await waiter
        finally:
            self.forget(waiter)


class TurnCalls:
    def __init__(self, run: JobCalls, turn: int) -> None:
        self.run = run
        self.turn = turn
        self.calls: list[ToolCall] = []
        self.outcomes: dict[int, CallOutcome] = {}
        self.notes: dict[int, str] = {}  # what is added to a call's result (a loop warning)
        self.seen: set[str] = set()
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.going: list[asyncio.Task[None]] = []  # reads sent as soon as they come
        self.groups: dict[int, int] = {}  # call index → its parallel group
        self.group = 0
        self.last_unsafe: asyncio.Task[None] | None = None
        self.since_unsafe: list[asyncio.Task[None]] = []
        self.complete = False  # every call of the turn is known (the reply has ended)
        # held calls go on: sent once the turn is stored (finish), else answered unsent
        self.released = Flag()
        # the turn's write has gone out: calls that wait for their claim go, gated
        self.storing = Flag()
        self.gate = ""  # what the gated calls carry (CallEnvelope.gate)
        self.gated: set[str] = set()  # calls sent before the turn was stored
        self.stored = False
        self.sent: set[int] = set()  # calls handed to dispatch
        self.kept: dict[str, CallOutcome] = {}  # a resumed parked turn's finished calls
        self.working = 0  # calls past their turn to start, not waiting for a person
        self.parking = Flag()  # a person's wait found the turn idle: park it
        self.unparked = Flag()  # the park found nothing pending: look again

    async def add(self, call: ToolCall) -> None:
        """Check one call (the gate) and schedule it; returns without waiting for it."""
        index = len(self.calls)
        self.calls.append(call)
        run = self.run
        verdict = run.loops.see(call, self.turn)
        if verdict == "stop":  # not run: the job ends once the turn is recorded
            run.looping = run.loops.stopped(call)
            self.outcomes[index] = run.error_outcome(self.turn, call, "not run: " + run.looping)
            await run.emit_finished(call, self.outcomes[index])
            return
        if verdict == "warn":
            self.notes[index] = run.loops.warning(call)
            run.defer("loop_warning", call_id=call.id, name=call.name, repeats=run.loops.run)
        checked = await self.run.gate.check(self.turn, call, self.seen)
        self.seen.add(call.id)
        if isinstance(checked, Refused):
            self.outcomes[index] = self.run.local_outcome(self.turn, call, checked)
            await self.run.emit_finished(call, self.outcomes[index])
            return
        if checked.tool.concurrency_safe(checked.args):
            before = [self.last_unsafe] if self.last_unsafe else []
            # a person is asked, and the transcript read, once the turn is stored
            hold = checked.asked is not None or checked.tool.reads_transcript
            task = asyncio.ensure_future(self._after(before, index, checked, hold=hold))
            self.since_unsafe.append(task)
            if not hold and not before:
                self.going.append(task)
        else:
            before = [t for t in (self.last_unsafe, *self.since_unsafe) if t]
            self.group += 1
            # one whose worker claims it before it acts may go as the turn is being stored
            early = (
                checked.asked is None
                and checked.tool.waits_for_claim
                and self.run.may_gate(self.turn)
            )
            task = asyncio.ensure_future(self._after(before, index, checked, True, early))
            self.last_unsafe, self.since_unsafe = task, []
            self.group += 1
        self.groups[index] = self.group
        self.tasks[index] = task

    async def _after(
        self,
        before: list[asyncio.Task[None]],
        index: int,
        ready: Ready,
        hold: bool,
        early: bool = False,
    ) -> None:
        if before:
            await asyncio.wait(before)
        if hold:
            await (self.storing if early else self.released).wait()
        if index in self.outcomes:  # stopped before it started
            return
        self.working += 1
        try:
            await self._run(index, ready, early)
        finally:
            self.working -= 1

    async def _run(self, index: int, ready: Ready, early: bool = False) -> None:
        run = self.run
        if (kept := self.kept.get(ready.call.id)) is not None:  # it ran before the park
            self.outcomes.setdefault(index, kept)
            await run.emit_finished(ready.call, kept)
            return
        if ready.asked is not None:
            confirmed = await run.gate.confirm(self.turn, ready, self.person)
            if isinstance(confirmed, Refused):
                self.outcomes.setdefault(index, run.local_outcome(self.turn, ready.call, confirmed))
                await run.emit_finished(ready.call, self.outcomes[index])
                return
            ready = confirmed
            if index in self.outcomes:  # stopped while it waited
                return
        self.sent.add(index)
        if (question := ready.tool.question(ready.args)) is not None:
            outcome = await run.after(
                ready, await run.ask_person(self.turn, ready, question, self.person)
            )
        else:
            outcome = await run.dispatch(self.turn, ready, index, early)
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
        self.release()  # every call has its outcome: what was held returns unsent

    def release(self) -> None:
        self.storing.set()
        self.released.set()

    def storing_begins(self) -> bool:
        """The turn's write goes out: the calls that may go gated are sent now (True: one
        waits to)."""
        waiting = self.storing.awaited()
        self.storing.set()
        return waiting

    def gate_for(self, call_id: str) -> str:
        """The gate of a call that may go gated, as it is sent ("" once the turn is
        stored). Asked right before the send, with no wait between: the call is either
        sent ungated or among those `stored_now` opens."""
        if self.stored:
            return ""
        self.gate = self.gate or secrets.token_hex(12)
        self.gated.add(call_id)
        return self.gate

    async def stored_now(self) -> None:
        """The turn is stored: its gate opens, and the calls sent gated act. Redis away:
        their workers find the turn in the transcript instead."""
        self.stored = True
        if not self.gated:
            return
        run = self.run
        for call_id in self.gated:
            run.s.dispatcher.opened(run.job_id, self.turn, call_id)
        # kept as long as a delivery of them may come (CallEnvelope.deadline)
        await open_gate(run.s.redis, self.gate, run.s.settings.visibility_timeout_s)

    def cut(self) -> None:
        """The reply broke off, or its write failed, before the turn was stored: the calls
        held for its end never go, and those sent gated never act (nothing records them;
        the model is asked again)."""
        reason = "not run: the model's reply broke off"
        run = self.run
        for i, call in enumerate(self.calls):
            unstored = call.id in self.gated and not self.stored  # its worker finds none
            if i not in self.sent or unstored:
                self.outcomes.setdefault(
                    i, cancelled_outcome(run.job_id, self.turn, call.id, reason)
                )
            if unstored:
                run.s.dispatcher.resolve_cancelled(run.job_id, self.turn, call.id, reason)
        self.release()

    async def finish(self, calls: list[ToolCall]) -> None:
        """Schedule any call the stream did not deliver, wait for all, record in order."""
        for call in calls[len(self.calls) :]:
            await self.add(call)
        self.complete = True
        self.stored = True  # the caller stored the turn before it asked for its end
        self.release()
        await self.settle_all()
        for task in self.tasks.values():
            task.result()  # a bug in dispatch surfaces here, not silently
        await self.run.record(self.turn, self.calls, self.outcomes, self.notes)

    async def settle_all(self) -> None:
        """Wait for every call; park the job when a person's wait asks for it and nothing
        of the turn runs (a request still pending in PostgreSQL), else go on waiting."""
        left = set(self.tasks.values())
        while left:
            parking = self.parking.waiter()
            waits: set[asyncio.Future[Any]] = {*left, parking}
            try:
                _, pending = await asyncio.wait(waits, return_when="FIRST_COMPLETED")
            finally:
                self.parking.forget(parking)
            pending.discard(parking)
            left = {t for t in left if t in pending}
            failed = [
                t for t in self.tasks.values() if t.done() and not t.cancelled() and t.exception()
            ]
            if failed or self.parking.is_set():
                parked = not failed and self.idle() and await self.park()
                if failed or parked:
                    for task in left:
                        task.cancel()
                    if left:
                        await asyncio.wait(left)
                    if failed:
                        failed[0].result()
                    raise JobParked
                self.parking.clear()
                self.unparked.set()
                self.unparked = Flag()

    async def park(self) -> bool:
        """The turn's finished calls kept in the durable ledger, then the job parked."""
        done = [self.outcomes[i] for i in self.sent if i in self.outcomes]
        await requests.keep_outcomes(self.run.s.store.pool, done)
        return await self.run.park()

    def running(self) -> bool:
        """A read the stream delivered is on its way: one pass of the loop takes it to its
        publish, which then leaves before the turn's write is built and sent (the write
        took 0.4 ms of the process before the publish left, bench (i)). What reads the
        transcript is held for the write instead (`Tool.reads_transcript`)."""
        return any(not t.done() for t in self.going)

    def reads_only(self, reply: Message) -> bool:
        """Every call came with the stream, a read on its way: none waits for the turn's write."""
        return len(reply.tool_calls) == len(self.calls) > 0 and all(
            i in self.outcomes or self.tasks.get(i) in self.going for i in range(len(self.calls))
        )

    def idle(self) -> bool:
        """Nothing of the turn runs: every call left waits for a person, or behind one."""
        return self.complete and self.working == 0

    async def person(self, request_id: str, expires_at: datetime | None) -> PersonRequest:
        """A person's answer to a request of this turn (or its time running out): heard in
        memory; after `park_after_s`, once the turn is idle, the job is parked instead."""
        s = self.run.s
        deadline = (
            None
            if expires_at is None
            else time.monotonic() + (expires_at.timestamp() - time.time())
        )
        park_at = time.monotonic() + s.settings.park_after_s
        self.working -= 1
        try:
            while True:
                until = park_at if deadline is None else min(park_at, deadline)
                answer = await s.approvals.wait(request_id, max(0.0, until - time.monotonic()))
                if answer is not None or (deadline is not None and time.monotonic() >= deadline):
                    break
                if self.idle():
                    unparked = self.unparked
                    self.parking.set()
                    await unparked.wait()  # cancelled instead when the job parks
                    found = await requests.find(s.store.pool, request_id)
                    if found is not None and found.status != "pending":
                        return found
                park_at = time.monotonic() + PARK_RETRY_S
        finally:
            self.working += 1
        found = await requests.find(s.store.pool, request_id)
        if found is None or found.status == "pending":  # its time is up: first to close wins
            found = await requests.settle(s.store.pool, request_id, "timeout", "timeout")
        assert found is not None  # it was opened by this job
        return found


async def open_gate(client: aioredis.Redis, gate: str, ttl_s: int) -> None:
    """Say that the turn whose calls carry `gate` is stored (keys.turn_gate). Redis away:
    their workers find the turn in the transcript instead."""
    key = keys.turn_gate(gate)
    try:
        async with client.pipeline(transaction=False) as pipe:
            pipe.rpush(key, "stored")
            pipe.expire(key, ttl_s)
            await pipe.execute()
    except aioredis.RedisError as exc:
        log.warning("gate %s not opened (%s)", gate, exc)
