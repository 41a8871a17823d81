"""Sending tool calls to their queues and waking the awaiting loop when outcomes arrive.

One listener per orchestrator process pops outcomes from its reply list (BRPOP: pushed,
never polled per call; what queued behind the first comes in the same round trip) and
resolves the waiting futures. A watchdog notices calls whose executing process stopped
heartbeating and sends them again; the worker-side ledger caps deliveries and answers
repeats. A call that no worker starts is announced as waiting, and answered with an error
after the schedule-to-start timeout.
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

from broker import keys
from broker.celery.publisher import AsyncPublisher
from broker.config.settings import Settings
from broker.errors import Signal
from broker.protocol import CallEnvelope, CallOutcome, Event
from broker.redis import events
from broker.redis.connections import retry_pause
from workers.tasks import task_name

log = logging.getLogger("clawq.dispatch")

REPLIES_PER_READ = 500  # outcomes taken by one read of the reply list


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


class NotAdmitted(Signal):
    """The session's rate limit refused the call as it was sent: no worker will see it."""

    def __init__(self, used: int) -> None:
        super().__init__(used)
        self.used = used


@dataclass
class Pending:
    envelope: CallEnvelope
    queue: str
    future: asyncio.Future[CallOutcome]
    resent_for: set[str] = field(default_factory=set)
    sent_at: float = field(default_factory=time.monotonic)
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

    def stop(self) -> None:
        """The listener returns after its current blocking read (at most a second)."""
        self.stopping.set()

    async def call(
        self,
        envelope: CallEnvelope,
        queue: str,
        prelude: Callable[[Any], None] | None = None,
        admit: Callable[[Any, str, str], None] | None = None,
    ) -> CallOutcome:
        """Send one call and wait for its outcome; `prelude` adds commands (the job's
        pending events) to the publish's round trip, and `admit` pushes the message only
        if the rate limit admits it (ratelimit.RateLimiter.push): else NotAdmitted."""
        key = (envelope.job_id, envelope.turn, envelope.call_id)
        pending = Pending(envelope, queue, asyncio.get_running_loop().create_future())
        self.pending[key] = pending
        try:
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
        return await self.publisher.send(
            queue=pending.queue, prelude=prelude, push=push, **self._options(pending.envelope)
        )

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
        async with self.redis.pipeline(transaction=False) as pipe:
            for p in items:
                e = p.envelope
                pipe.hmget(keys.call(e.job_id, e.turn, e.call_id), ["status", "proc", "outcome"])
            states = await pipe.execute()
        running = [
            (p, owner.decode())
            for p, (status, owner, _) in zip(items, states, strict=True)
            if status == b"running" and owner
        ]
        for status, _, outcome in states:
            if status == b"done" and outcome:  # recorded, but the push was lost
                self._resolve(CallOutcome.model_validate_json(outcome))
        await self._not_taken(
            [p for p, (status, _, _) in zip(items, states, strict=True) if status is None]
        )
        if not running:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for _, owner in running:
                pipe.exists(keys.proc(owner))
            alive = await pipe.execute()
        for (p, owner), live in zip(running, alive, strict=True):
            if not live and owner not in p.resent_for and not p.future.done():
                p.resent_for.add(owner)
                log.warning("call %s: %s died; sending it again", p.envelope.call_id, owner)
                p.envelope.resent = True
                await self._send(p)


@asynccontextmanager
async def running_dispatcher(settings: Settings, name: str) -> AsyncIterator[Dispatcher]:
    """A dispatcher with its reply listener running, for code that sends calls directly
    (benchmarks, tests); the orchestrator wires its own."""
    from broker.celery.app import create_app
    from broker.redis.connections import async_redis

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
