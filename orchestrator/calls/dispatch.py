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
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
from celery import Celery

from broker import keys
from broker.celery.publisher import AsyncPublisher
from broker.config.settings import Settings
from broker.errors import Signal
from broker.protocol import CallEnvelope, CallOutcome
from broker.redis.connections import retry_pause
from orchestrator.calls.pending import Pending, call_field, cancelled_outcome
from orchestrator.calls.watchdog import CallWatchdog
from workers.tasks import task_name

log = logging.getLogger("clawq.dispatch")

REPLIES_PER_READ = 500  # outcomes taken by one read of the reply list
LOOK_AGAIN_S = 5.0  # a call found waiting in its queue is looked for again after this
QUEUE_SCAN = 10_000  # messages from the queue's tail a search reads at most


class NotAdmitted(Signal):
    """The session's rate limit refused the call as it was sent: no worker will see it."""

    def __init__(self, used: int) -> None:
        super().__init__(used)
        self.used = used


class Dispatcher(CallWatchdog):
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
        sent: asyncio.Future[None] | None = None,
    ) -> CallOutcome:
        """Send one call and wait for its outcome; `prelude` adds commands (the job's
        pending events) to the publish's round trip, and `admit` pushes the message only
        if the rate limit admits it (ratelimit.RateLimiter.push): else NotAdmitted.
        `pinned`: the process the call was routed to, holding its session's state.
        `sent` is done once that round trip is over (or will not be made): a write that
        must come after the prelude's commands waits for it.

        A call sent again (`envelope.resent`: a resumed turn) is first looked up in the hot
        ledger: done, its outcome is the answer; running, it is left to its runner (and to
        the watchdog, which checks the spools before it sends a dead runner's call again);
        only a call never begun, or let go, is sent."""
        key = (envelope.job_id, envelope.turn, envelope.call_id)
        pending = Pending(envelope, queue, asyncio.get_running_loop().create_future(), pinned)
        pending.shut = bool(envelope.gate)
        self.pending[key] = pending
        try:
            pushed: Any = None
            try:
                if envelope.resent and (found := await self.existing(envelope)) is not None:
                    if found is not True:
                        return found  # type: ignore[return-value]
                    if prelude is not None:  # held: not sent, the watchdog sees it recorded
                        async with self.redis.pipeline(transaction=False) as pipe:
                            prelude(pipe)
                            await pipe.execute()
                else:
                    pushed = await self._send(pending, prelude, admit)
            finally:
                if sent is not None and not sent.done():
                    sent.set_result(None)
            if pushed is not None and admit is not None and not pushed[0]:
                raise NotAdmitted(int(pushed[1]))
            return await pending.future
        finally:
            self.pending.pop(key, None)
            if pending.told_waiting:
                await self.redis.hdel(keys.CALLS_WAITING, call_field(envelope))

    def _options(self, env: CallEnvelope) -> dict[str, Any]:
        return {
            "name": env.task or task_name(env.tool),
            "kwargs": {"envelope": env.model_dump(mode="json")},
            "task_id": f"{env.call_id}.{secrets.token_hex(4)}",  # (uuid4: 1.7% of a turn)
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
        # a call sent again waits for a worker anew (schedule_to_start_timeout_s)
        pending.sent_at = pending.looked_at = time.monotonic()
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

    def opened(self, job_id: str, turn: int, call_id: str) -> None:
        """A call sent gated: its turn is stored now (a delivery that found it not stored
        and dropped it is lost from here on, and sent again)."""
        if (pending := self.pending.get((job_id, turn, call_id))) is not None:
            pending.shut = False

    def resolve_cancelled(self, job_id: str, turn: int, call_id: str, reason: str) -> None:
        """Answer a waiting call now: it was stopped (its worker is told separately)."""
        self._resolve(cancelled_outcome(job_id, turn, call_id, reason))

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
