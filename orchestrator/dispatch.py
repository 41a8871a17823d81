"""Sending tool calls to their queues and waking the awaiting loop when outcomes arrive.

One listener per orchestrator process pops outcomes from its reply list (BRPOP: pushed,
never polled per call; what queued behind the first comes in the same round trip) and
resolves the waiting futures. A watchdog (every heartbeat interval) finds the calls that
nobody holds any more and sends them again, marked `resent`; the worker-side ledger caps
deliveries and answers repeats:

- a call "running" under a process whose heartbeat is gone (judged only once Redis has been
  up for a heartbeat TTL: while it was away every heartbeat lapsed), unless a live process
  of any host lists it as held (its outcome waits in that host's spool);
- a call "running" under a live process whose heartbeat, beaten after the call began, does
  not list it (its task raised, its thread died): the ledger lets it go first;
- a call no worker began, gone from its queue and held by nobody (taken by a process that
  died before it began it).

A call pinned to one process (a browser session) whose process is gone is answered "session
lost" at once, whatever its heartbeat key still says: a process that died stops beating, so
a beat older than two intervals and a half is a dead one's. A call that no worker starts is
announced as waiting, and answered with an error after the schedule-to-start timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from celery import Celery

from broker import events, keys, outage
from broker.connections import retry_pause
from broker.ledger import RELEASE
from broker.messages import CallEnvelope, CallOutcome, Event
from broker.presence import stale
from broker.publisher import AsyncPublisher
from broker.settings import Settings
from workers.tasks import task_name

log = logging.getLogger("clawq.dispatch")

REPLIES_PER_READ = 500  # outcomes taken by one read of the reply list
LOOK_AGAIN_S = 5.0  # a call found waiting in its queue is looked for again after this
QUEUE_SCAN = 10_000  # messages from the queue's tail a search reads at most


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


class NotAdmitted(Exception):
    """The session's rate limit refused the call as it was sent: no worker will see it."""

    def __init__(self, used: int) -> None:
        super().__init__(used)
        self.used = used


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


class Dispatcher:
    def __init__(
        self, app: Celery, redis: aioredis.Redis, settings: Settings, orchestrator_id: str
    ) -> None:
        self.publisher = AsyncPublisher(app, redis)
        self.redis = redis
        self.settings = settings
        self.reply_key = keys.reply(orchestrator_id)
        self.pending: dict[tuple[str, int, str], Pending] = {}
        self.stopping = asyncio.Event()
        self._trust: bool | None = None  # heartbeats mean what they say (once a sweep)

    def stop(self) -> None:
        """The listener returns after its current blocking read (at most a second)."""
        self.stopping.set()

    async def call(
        self,
        envelope: CallEnvelope,
        queue: str,
        prelude: Callable[[Any], None] | None = None,
        admit: Callable[[Any, str, str], None] | None = None,
        pinned: str = "",
    ) -> CallOutcome:
        """Send one call and wait for its outcome; `prelude` adds commands (the job's
        pending events) to the publish's round trip, and `admit` pushes the message only
        if the rate limit admits it (ratelimit.RateLimiter.push): else NotAdmitted.
        `pinned`: the process the call was routed to, holding its session's state.

        A call sent again (`envelope.resent`: a resumed turn) is first looked up in the hot
        ledger: done, its outcome is the answer; running, it is left to its runner (and to
        the watchdog, which checks the spools before it sends a dead runner's call again);
        only a call never begun, or let go, is sent."""
        key = (envelope.job_id, envelope.turn, envelope.call_id)
        pending = Pending(envelope, queue, asyncio.get_running_loop().create_future(), pinned)
        self.pending[key] = pending
        try:
            if envelope.resent and (found := await self.existing(envelope)) is not None:
                if found is not True:
                    return found  # type: ignore[return-value]
                if prelude is not None:  # held: not sent, the watchdog sees it recorded
                    async with self.redis.pipeline(transaction=False) as pipe:
                        prelude(pipe)
                        await pipe.execute()
                return await pending.future
            pushed = await self._send(pending, prelude, admit)
            if admit is not None and not pushed[0]:
                raise NotAdmitted(int(pushed[1]))
            return await pending.future
        finally:
            self.pending.pop(key, None)
            if pending.told_waiting:
                await self.redis.hdel(keys.CALLS_WAITING, _field(envelope))

    def _options(self, env: CallEnvelope) -> dict[str, Any]:
        return {
            "name": env.task or task_name(env.tool),
            "kwargs": {"envelope": env.model_dump(mode="json")},
            "task_id": f"{env.call_id}.{uuid.uuid4().hex[:8]}",
            "soft_time_limit": env.timeout_s + self.settings.tool_grace_s,
            "time_limit": env.timeout_s + 2 * self.settings.tool_grace_s,
            "root_id": env.job_id,
            "parent_id": env.job_id,
            "kwargsrepr": repr({"tool": env.tool, "call_id": env.call_id, "job": env.job_id}),
        }

    async def _send(
        self,
        pending: Pending,
        prelude: Callable[[Any], None] | None = None,
        push: Callable[[Any, str, str], None] | None = None,
    ) -> Any:
        pending.raw = self.publisher.message(queue=pending.queue, **self._options(pending.envelope))
        pending.looked_at = time.monotonic()
        return await self.publisher.push(pending.queue, pending.raw, prelude, push)

    async def existing(self, e: CallEnvelope) -> CallOutcome | bool | None:
        """The call's recorded outcome; True when it is running (its owner's outcome comes
        to the ledger, or the watchdog deals with a dead owner, spool included); None when
        it may be sent."""
        status, outcome = await self.redis.hmget(
            keys.call(e.job_id, e.turn, e.call_id), ["status", "outcome"]
        )
        if status == b"done" and outcome:
            return CallOutcome.model_validate_json(outcome)
        return True if status == b"running" else None

    async def held_calls(self) -> set[str]:
        """Every call a live worker process holds, from the heartbeats of every host (read
        only when an owner is gone or a call is resent: a scan of the presence keys)."""
        held: set[str] = set()
        async for key in self.redis.scan_iter(match=keys.PROC_PATTERN, count=500):
            raw = await self.redis.get(key)
            if raw:
                held.update(json.loads(raw).get("calls") or ())
        return held

    def resolve_cancelled(self, job_id: str, turn: int, call_id: str, reason: str) -> None:
        """Answer a waiting call now: it was stopped (its worker is told separately)."""
        self._resolve(cancelled_outcome(job_id, turn, call_id, reason))

    def _resolve(self, outcome: CallOutcome) -> None:
        pending = self.pending.get((outcome.job_id, outcome.turn, outcome.call_id))
        if pending and not pending.future.done():
            pending.future.set_result(outcome)

    async def listen(self, client: aioredis.Redis) -> None:
        """Resolve futures as outcomes are pushed; `client` is a connection of its own.

        Stopped with `stop()`, not by cancelling: redis-py may retry a blocking read that a
        cancellation interrupted, and the cancellation is then lost."""
        while not self.stopping.is_set():
            try:  # the first outcome, waited for, and what queued behind it: one round trip
                async with client.pipeline(transaction=False) as pipe:
                    pipe.brpop([self.reply_key], timeout=1)
                    pipe.rpop(self.reply_key, REPLIES_PER_READ)
                    first, rest = await pipe.execute()
            except aioredis.RedisError as exc:  # reconnects on the next call
                await retry_pause(exc, "reply listener")
                continue
            for raw in ([first[1]] if first else []) + (rest or []):
                try:
                    self._resolve(CallOutcome.model_validate_json(raw))
                except ValueError:
                    log.error("unreadable outcome dropped: %r", raw[:200])
            if first:  # the waiting jobs go on before the next read is sent
                await asyncio.sleep(0)

    async def _not_taken(self, items: list[Pending]) -> None:
        """Calls no worker has started. After `call_waiting_after_s` a `tool_call_waiting`
        event names the queue (and `clawq status` lists the call); after
        `schedule_to_start_timeout_s` the model is answered with an error and the message
        left in the queue is cancelled, so a worker that comes later skips it."""
        s, now = self.settings, time.monotonic()
        for p in items:
            e, waited = p.envelope, now - p.sent_at
            if p.future.done():
                continue
            if waited >= s.schedule_to_start_timeout_s:
                reason = (
                    f"no worker took {e.tool} from the '{p.queue}' queue within "
                    f"{s.schedule_to_start_timeout_s:g} s: is a worker for it running "
                    f"(clawq worker --group {p.queue.split('.')[0]})? Try later or another tool."
                )
                await self.redis.set(
                    keys.cancel_call(e.job_id, e.turn, e.call_id), reason, ex=s.events_ttl_s
                )
                self._resolve(cancelled_outcome(e.job_id, e.turn, e.call_id, reason))
            elif waited >= s.call_waiting_after_s and not p.told_waiting:
                p.told_waiting = True
                info = {"queue": p.queue, "tool": e.tool, "job": e.job_id, "since": time.time()}
                await self.redis.hset(keys.CALLS_WAITING, _field(e), json.dumps(info))
                await events.emit(
                    self.redis,
                    Event(
                        type="tool_call_waiting",
                        job_id=e.job_id,
                        data={"call_id": e.call_id, "queue": p.queue, "waited_s": round(waited, 1)},
                    ),
                    s.events_ttl_s,
                )

    async def watchdog(self) -> None:
        """Every heartbeat interval: re-send calls whose executing process has died."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_interval_s)
            try:
                await self._sweep()
            except aioredis.RedisError as exc:
                await retry_pause(exc, "watchdog sweep", 0)

    async def _sweep(self) -> None:
        # a call younger than one interval is looked at in the next sweep: thousands of
        # short calls in flight cost no Redis work, and a death is still seen in seconds
        young = time.monotonic() - self.settings.heartbeat_interval_s
        items = [p for p in self.pending.values() if p.sent_at <= young]
        if not items:
            return
        fields = ["status", "proc", "outcome", "started_at"]
        async with self.redis.pipeline(transaction=False) as pipe:
            for p in items:
                e = p.envelope
                pipe.hmget(keys.call(e.job_id, e.turn, e.call_id), fields)
            states = await pipe.execute()
        running = [
            (p, owner.decode(), started or b"")
            for p, (status, owner, _, started) in zip(items, states, strict=True)
            if status == b"running" and owner
        ]
        for status, _, outcome, _ in states:
            if status == b"done" and outcome:  # recorded, but the push was lost
                self._resolve(CallOutcome.model_validate_json(outcome))
        waiting = [p for p, (status, *_) in zip(items, states, strict=True) if status is None]
        self._trust = None
        await self._not_begun(waiting)
        await self._not_taken(waiting)
        if running:
            await self._not_held(running)

    async def _beats(self, procs: set[str]) -> dict[str, tuple[dict[str, Any] | None, int]]:
        """Each process's heartbeat (None when gone) and its key's remaining life (ms)."""
        names = sorted(procs)
        async with self.redis.pipeline(transaction=False) as pipe:
            for proc in names:
                pipe.get(keys.proc(proc))
                pipe.pttl(keys.proc(proc))
            found = await pipe.execute()
        beats = {}
        for i, proc in enumerate(names):
            raw, pttl = found[2 * i], found[2 * i + 1]
            beats[proc] = (json.loads(raw) if raw else None, int(pttl or 0))
        return beats

    async def _trusted(self) -> bool:
        """Whether a missing or stale heartbeat means a dead process now (once a sweep)."""
        if self._trust is None:
            s = self.settings
            self._trust = await outage.heartbeats_trusted(
                self.redis, s.heartbeat_interval_s, s.heartbeat_ttl_s
            )
        return self._trust

    def _stale(self, pttl_ms: int) -> bool:
        s = self.settings
        return stale(pttl_ms, s.heartbeat_interval_s, s.heartbeat_ttl_s)

    async def _not_held(self, running: list[tuple[Pending, str, bytes]]) -> None:
        """Calls begun by a process that died, or that a live process dropped."""
        beats = await self._beats({owner for _, owner, _ in running})
        held: set[str] | None = None
        for p, owner, started in running:
            e = p.envelope
            info, pttl = beats[owner]
            claim = f"{owner}@{started.decode()}"
            if p.future.done() or claim in p.resent_for:
                continue
            if p.pinned and (info is None or self._stale(pttl)) and await self._trusted():
                self._resolve(session_lost(e, owner, began=True))  # its state died with it
                continue
            if info is None:  # the owner's heartbeat is gone
                if not await self._trusted():  # Redis has just come back: beats resume
                    continue
                if held is None:
                    held = await self.held_calls()
                if _field(e) in held:  # its outcome waits in a live host's spool
                    continue
                p.resent_for.add(claim)
                log.warning("call %s: %s died; sending it again", e.call_id, owner)
            else:
                calls, at = info.get("calls"), info.get("at")
                if calls is None or at is None or _field(e) in calls:
                    continue
                if not started or at <= float(started):  # beaten before the call began
                    continue
                call = keys.call(e.job_id, e.turn, e.call_id)
                if not await self.redis.eval(RELEASE, 1, call, owner, started):
                    continue  # finished or taken over meanwhile
                p.resent_for.add(claim)
                log.warning(
                    "call %s: live %s no longer holds it; sending it again", e.call_id, owner
                )
            e.resent = True
            await self._send(p)

    async def _not_begun(self, items: list[Pending]) -> None:
        """Calls no worker began: a pinned one whose process is gone is answered "session
        lost"; one gone from its queue that no live process holds (its taker died before
        beginning it) is sent again."""
        s, now = self.settings, time.monotonic()
        pinned = [p for p in items if p.pinned and not p.future.done()]
        if pinned and await self._trusted():
            beats = await self._beats({p.pinned for p in pinned})
            for p in pinned:
                info, pttl = beats[p.pinned]
                if info is None or self._stale(pttl):
                    self._resolve(session_lost(p.envelope, p.pinned))
                    await self.redis.lrem(p.queue, 1, p.raw)  # nobody will ever take it
        due = [
            p
            for p in items
            if not p.pinned
            and not p.future.done()
            and p.raw
            and now - p.looked_at >= max(2 * s.heartbeat_interval_s, 1.0)
        ]
        if not due:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for p in due:
                p.looked_at = now + LOOK_AGAIN_S - max(2 * s.heartbeat_interval_s, 1.0)
                pipe.lpos(p.queue, p.raw, rank=-1, maxlen=QUEUE_SCAN)
            found = await pipe.execute()
        gone = [p for p, at in zip(due, found, strict=True) if at is None]
        if not gone:
            return
        held = await self.held_calls()
        async with self.redis.pipeline(transaction=False) as pipe:
            for p in gone:
                e = p.envelope
                pipe.hget(keys.call(e.job_id, e.turn, e.call_id), "status")
            statuses = await pipe.execute()
        for p, status in zip(gone, statuses, strict=True):
            e = p.envelope
            if status is not None or _field(e) in held or p.future.done():
                continue  # begun meanwhile, or a live process has it
            log.warning(
                "call %s: taken from %s and never begun; sending it again", e.call_id, p.queue
            )
            e.resent = True
            await self._send(p)


@asynccontextmanager
async def running_dispatcher(settings: Settings, name: str) -> AsyncIterator[Dispatcher]:
    """A dispatcher with its reply listener running, for code that sends calls directly
    (benchmarks, tests); the orchestrator wires its own."""
    from broker.celery_app import create_app
    from broker.connections import async_redis

    client = async_redis(settings)
    listener = aioredis.Redis.from_url(settings.redis_url)
    dispatcher = Dispatcher(create_app(settings), client, settings, name)
    listen = asyncio.create_task(dispatcher.listen(listener))
    try:
        yield dispatcher
    finally:
        dispatcher.stop()
        await listen
        await client.aclose()
        await listener.aclose()


def _field(e: CallEnvelope) -> str:
    return f"{e.job_id}:{e.turn}:{e.call_id}"
