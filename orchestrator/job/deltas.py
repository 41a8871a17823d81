"""The model's text as it arrives, as `model_delta` events on the job's stream.

A provider hands over every piece of text it reads (a token or a few); they are coalesced
here, sent at the next tick of `stream_delta_interval_ms` (at most that long after the
first waiting piece) or once `stream_delta_max_chars` wait. The ticks are the same
instants for every job of the process (multiples of the interval on the loop's clock), so
the deltas of many jobs streaming at once go in one Redis batch (broker/redis/autopipe.py)
instead of one round trip each. One writer per turn sends its batches in order; while it
waits on Redis the next batches gather and go together. The stream's TTL is set with the
turn's first delta (the turn's other events set it again). The turn's start is on the
stream before its first delta: in the same write when it still waits, else after the write
that took it (its own, or a call's publish) is over; the model is asked without a round
trip first. Each delta says where its text starts in the turn's reply (`offset`); a reply
asked for again (failover) sends `reset` first, and the text starts again at 0. Deltas are
events only: the transcript keeps the final text (`model_text`). Losing one to a Redis error
is logged, not fatal: the final text still comes. A job whose answer is written live in its
chat hands each batch to its preview as well (orchestrator/job/preview.py), also when
`stream_model_deltas` is off (then no event is sent).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, Protocol

import redis.asyncio as aioredis

from broker.config.settings import Settings
from broker.protocol import Event
from broker.redis import events
from orchestrator.job.preview import ChatPreview

log = logging.getLogger("clawq.loop")


class JobEvents(Protocol):
    async def lead(self, pipe: Any) -> None: ...


class TurnDeltas:
    def __init__(
        self,
        redis: aioredis.Redis,
        settings: Settings,
        job_id: str,
        turn: int,
        preview: ChatPreview | None = None,
        lead: JobEvents | None = None,
    ) -> None:
        self.redis = redis
        self.preview = preview
        self.lead = lead  # the job's events, the turn's start among them: first on the stream
        self.job_id = job_id
        self.turn = turn  # as events count turns: from 1
        self.interval_s = settings.stream_delta_interval_ms / 1000
        self.max_chars = settings.stream_delta_max_chars
        self.ttl_s = settings.events_ttl_s
        self.sends = settings.stream_model_deltas  # off: only a preview is fed
        self.waiting: list[str] = []
        self.chars = 0  # of what waits
        self.offset = 0  # where what waits starts in the reply
        self.outbox: list[Event] = []
        self.timer: asyncio.TimerHandle | None = None
        self.writer: asyncio.Future[None] | None = None
        self.gave = False  # some text left since the last reset
        self.closed = False
        self.ttl_set = False  # on the job's stream, by this turn's first delta

    def text(self, chunk: str) -> None:
        if self.closed or not chunk:
            return
        self.waiting.append(chunk)
        self.chars += len(chunk)
        if self.chars >= self.max_chars:
            self.batch()
        elif self.timer is None:
            loop = asyncio.get_running_loop()
            tick = self.interval_s
            at = (math.floor(loop.time() / tick) + 1) * tick if tick > 0 else loop.time()
            self.timer = loop.call_at(at, self.batch)

    def reset(self) -> None:
        """The reply is asked for again: what was sent is void, what waits is dropped."""
        self._stop_timer()
        self.waiting, self.chars, self.offset = [], 0, 0
        self.outbox = []
        if self.preview is not None:
            self.preview.reset(self.turn)
        if self.gave:
            self.gave = False
            self._send({"turn": self.turn, "reset": True, "offset": 0, "text": ""})

    def batch(self) -> None:
        """What waits becomes one delta, sent by the writer."""
        self._stop_timer()
        if not self.waiting:
            return
        text = "".join(self.waiting)
        data = {"turn": self.turn, "offset": self.offset, "text": text}
        self.offset += len(text)
        self.waiting, self.chars = [], 0
        self.gave = True
        self._send(data)
        if self.preview is not None:
            self.preview.add(self.turn, text)

    async def close(self) -> None:
        """The reply ended (or broke off): what waits goes, and every delta is sent, before
        the turn's own events."""
        self.batch()
        self.closed = True
        if self.writer is not None:
            await asyncio.shield(self.writer)

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _send(self, data: dict[str, Any]) -> None:
        if not self.sends:
            return
        self.outbox.append(Event(type="model_delta", job_id=self.job_id, data=data))
        if self.writer is None or self.writer.done():
            self.writer = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        while self.outbox:
            batch, self.outbox = self.outbox, []
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    if self.lead is not None:
                        lead, self.lead = self.lead, None
                        await lead.lead(pipe)
                    events.add(pipe, batch, None if self.ttl_set else self.ttl_s)
                    await pipe.execute()
                self.ttl_set = True
            except aioredis.RedisError as exc:
                log.warning("job %s: %d model deltas not sent: %s", self.job_id, len(batch), exc)
