"""Sending tool calls to their queues and waking the awaiting loop when outcomes arrive.

One listener per orchestrator process pops outcomes from its reply list (BRPOP: pushed,
never polled per call) and resolves the waiting futures. A watchdog notices calls whose
executing process stopped heartbeating and sends them again; the worker-side ledger caps
deliveries and answers repeats.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from celery import Celery

from broker import keys
from broker.connections import retry_pause
from broker.messages import CallEnvelope, CallOutcome
from broker.publisher import AsyncPublisher
from broker.settings import Settings
from workers.tasks import task_name

log = logging.getLogger("clawq.dispatch")


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


@dataclass
class Pending:
    envelope: CallEnvelope
    queue: str
    future: asyncio.Future[CallOutcome]
    resent_for: set[str] = field(default_factory=set)


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

    async def call(self, envelope: CallEnvelope, queue: str) -> CallOutcome:
        """Send one call and wait for its outcome."""
        key = (envelope.job_id, envelope.turn, envelope.call_id)
        pending = Pending(envelope, queue, asyncio.get_running_loop().create_future())
        self.pending[key] = pending
        try:
            await self._send(pending)
            return await pending.future
        finally:
            self.pending.pop(key, None)

    async def _send(self, pending: Pending) -> None:
        env = pending.envelope
        await self.publisher.send(
            name=env.task or task_name(env.tool),
            queue=pending.queue,
            kwargs={"envelope": env.model_dump(mode="json")},
            task_id=f"{env.call_id}.{uuid.uuid4().hex[:8]}",
            soft_time_limit=env.timeout_s + self.settings.tool_grace_s,
            time_limit=env.timeout_s + 2 * self.settings.tool_grace_s,
            root_id=env.job_id,
            parent_id=env.job_id,
            kwargsrepr=repr({"tool": env.tool, "call_id": env.call_id, "job": env.job_id}),
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
            try:
                popped = await client.brpop([self.reply_key], timeout=1)
            except aioredis.RedisError as exc:  # reconnects on the next call
                await retry_pause(exc, "reply listener")
                continue
            if popped is None:
                continue
            try:
                self._resolve(CallOutcome.model_validate_json(popped[1]))
            except ValueError:
                log.error("unreadable outcome dropped: %r", popped[1][:200])

    async def watchdog(self) -> None:
        """Every heartbeat interval: re-send calls whose executing process has died."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_interval_s)
            try:
                await self._sweep()
            except aioredis.RedisError as exc:
                await retry_pause(exc, "watchdog sweep", 0)

    async def _sweep(self) -> None:
        items = list(self.pending.values())
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
