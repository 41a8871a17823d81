"""Event streams for many watchers: one Redis read for every job this API process follows.

A reader task keeps one blocking XREAD over the streams of every job someone watches and
hands each new event to that job's feed; every watcher of the job reads the feed. A new
watcher joins the feed first, then reads what it missed with XRANGE, then its queue of
the feed's events, skipping what it already has by stream id: nothing falls between. A private
wake stream interrupts the blocking read when the set of jobs changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from broker import keys
from broker.protocol import Event

BLOCK_MS = 5000


def _order(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(frozen=True)
class Sent:
    """An event as every watcher sends it: its JSON made once, not once per watcher."""

    id: str
    type: str
    json: str


def _event(entry_id: Any, fields: dict[Any, Any]) -> Sent:
    event = Event.model_validate_json(fields[b"e"])
    event.id = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return Sent(event.id, event.type, event.model_dump_json())


@dataclass
class Feed:
    last: str = ""  # where the reader goes on from; empty until the feed is ready
    watchers: set[asyncio.Queue[Sent]] = field(default_factory=set)
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class EventHub:
    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self.feeds: dict[str, Feed] = {}
        self.wake = f"{keys.PREFIX}:api:wake:{uuid.uuid4().hex}"
        self.woken = "0-0"  # the wake stream's last entry read (not "$": none may be missed)
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.task = asyncio.create_task(self._read(), name="clawq-event-hub")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.redis.delete(self.wake)

    async def _read(self) -> None:
        while True:
            streams = {
                self.wake: self.woken,
                **{keys.events(j): f.last for j, f in self.feeds.items() if f.last},
            }
            try:
                batch: Any = await self.redis.xread(streams, count=500, block=BLOCK_MS)  # type: ignore[arg-type]
            except aioredis.RedisError:
                await asyncio.sleep(0.5)
                continue
            for key, entries in batch or []:
                name = key.decode() if isinstance(key, bytes) else key
                if name == self.wake:
                    self.woken = entries[-1][0].decode()
                    continue
                feed = self.feeds.get(name.removeprefix(keys.events("")))
                if feed is None:
                    continue
                for entry_id, fields in entries:
                    event = _event(entry_id, fields)
                    feed.last = event.id
                    for queue in feed.watchers:
                        queue.put_nowait(event)

    async def watch(
        self, job_id: str, after: str | None, keepalive_s: float
    ) -> AsyncIterator[Sent | None]:
        """The job's events after `after`, until `job_finished`; None when nothing came for
        `keepalive_s` (time for a keep-alive comment)."""
        feed = self.feeds.get(job_id)
        if feed is None:  # made before any await: one feed per job, whoever comes at once
            feed = self.feeds[job_id] = Feed()
            newest: Any = await self.redis.xrevrange(keys.events(job_id), count=1)
            feed.last = newest[0][0].decode() if newest else "0-0"
            feed.ready.set()
            await self.redis.xadd(self.wake, {"j": job_id}, maxlen=10)  # read it too
        await feed.ready.wait()
        queue: asyncio.Queue[Sent] = asyncio.Queue()
        feed.watchers.add(queue)  # before the backlog is read: nothing falls between
        last = after or "0-0"
        try:
            backlog: Any = await self.redis.xrange(keys.events(job_id), min=f"({last}")
            for entry_id, fields in backlog:
                event = _event(entry_id, fields)
                last = event.id
                yield event
                if event.type == "job_finished":
                    return
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), keepalive_s)
                except TimeoutError:
                    yield None
                    continue
                if _order(event.id) <= _order(last):
                    continue  # read already, in the backlog
                last = event.id
                yield event
                if event.type == "job_finished":
                    return
        finally:
            feed.watchers.discard(queue)
            if not feed.watchers and self.feeds.get(job_id) is feed:
                del self.feeds[job_id]
