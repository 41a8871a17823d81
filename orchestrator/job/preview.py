"""A job's answer written live in the chat it came from (a channel's `live_answers`).

The orchestrator says what the chat should show: the text of the turn in flight, at most
once per interval, and the final text when the job ends. It writes that into the job's
preview record in Redis (a version counted up with it) and wakes a messaging worker,
which sends the first text, edits it after, and replaces it with the final
(workers/tools/messaging/preview.py). A worker always applies the newest version, so a
late or repeated wake-up changes nothing. Nothing here waits on the worker or the
provider: a turn never slows for the chat, and a failure is logged, never the job's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import redis.asyncio as aioredis
from celery import Celery

from broker import keys
from broker.config.settings import Settings
from broker.protocol import Group, JobSpec
from workers.tools.messaging.preview import PREVIEW_TASK, TEXT_CAP

log = logging.getLogger("clawq.loop")

ENDED = "⚠ The job ended without an answer ({status})."


def previewed(spec: JobSpec, settings: Settings) -> bool:
    """A root job from a chat of a channel with live answers (not a subagent's, nor an
    announce job's, nor a fork's: their answers are not the chat's)."""
    if not (spec.channel and spec.chat_id) or spec.parent_id or spec.depth:
        return False
    if spec.announce or spec.fork is not None or spec.replay is not None:
        return False
    channel = settings.message_channels.get(spec.channel)
    return channel is not None and channel.live_answers


class ChatPreview:
    def __init__(
        self, redis: aioredis.Redis, app: Celery, settings: Settings, job_id: str, spec: JobSpec
    ) -> None:
        self.redis = redis
        self.app = app
        self.job_id = job_id
        self.channel, self.chat = spec.channel, spec.chat_id
        config = settings.message_channels[spec.channel]
        self.interval_s = config.live_interval_s or settings.chat_preview_interval_s
        self.ttl_s = settings.events_ttl_s
        self.retry_s = settings.chat_preview_retry_s
        self.turn = 0
        self.text = ""  # of the turn in flight
        self.shown = ""  # the text last handed to the chat
        self.sent_at = -1e9  # time.monotonic() of that
        self.timer: asyncio.TimerHandle | None = None
        self.writing: asyncio.Future[None] | None = None
        self.ended = False

    def add(self, turn: int, chunk: str) -> None:
        """More of a turn's text (a coalesced batch); a new turn's text starts over."""
        if self.ended:
            return
        if turn != self.turn:
            self.turn, self.text = turn, ""
        if len(self.text) < TEXT_CAP:  # past it the chat shows no more until the final
            self.text = (self.text + chunk)[:TEXT_CAP]
            self._schedule()

    def reset(self, turn: int) -> None:
        """The turn's reply is asked for again: its text starts over (the chat keeps what it
        shows until the new text comes)."""
        self.turn, self.text = turn, ""

    def _schedule(self) -> None:
        if self.timer is not None or self.writing is not None or self.ended:
            return  # a write is due or under way: it takes the text then
        delay = max(0.0, self.sent_at + self.interval_s - time.monotonic())
        self.timer = asyncio.get_running_loop().call_later(delay, self._due)

    def _due(self) -> None:
        self.timer = None
        if self.ended or not self.text.strip() or self.text == self.shown:
            return
        self.writing = asyncio.ensure_future(self._write(self.text, final=False))

    async def _write(self, text: str, final: bool) -> None:
        self.shown, self.sent_at = text, time.monotonic()
        try:
            await self.publish(text, final)
        except Exception as exc:  # the chat misses a version; the job goes on
            log.warning("job %s: live answer not handed over: %s", self.job_id, exc)
        finally:
            self.writing = None
            if not self.ended and self.text != self.shown:
                self._schedule()

    async def publish(self, text: str, final: bool) -> None:
        """The newest version in the job's record, and a worker woken for it."""
        key = keys.chat_preview(self.job_id)
        fields: dict[Any, Any] = {"channel": self.channel, "chat": self.chat, "text": text}
        if final:
            fields["final"] = 1
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(key, "version", 1)
            pipe.hset(key, mapping=fields)
            pipe.expire(key, self.ttl_s)
            if final:  # looked at again until a worker has written it (a lost wake-up)
                pipe.zadd(keys.CHAT_FINALS_DUE, {self.job_id: time.time() + self.retry_s})
            await pipe.execute()
        await asyncio.to_thread(
            self.app.send_task, PREVIEW_TASK, args=[self.job_id], queue=Group.messaging.value
        )

    async def final(self, status: str, text: str) -> None:
        """The job's end: its final text replaces what the chat shows (a job that ended
        without one says so under the text shown)."""
        self.stop()
        if self.writing is not None:
            await asyncio.shield(self.writing)
        if status != "completed":
            note = ENDED.format(status=status)
            text = f"{self.shown.rstrip()}\n\n{note}" if self.shown.strip() else note
        if not text.strip():
            return
        try:
            await self.publish(text, final=True)
        except Exception as exc:
            log.warning("job %s: final answer not handed to the chat: %s", self.job_id, exc)

    def stop(self) -> None:
        """No more versions from this run (it ended, or left the process parked)."""
        self.ended = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
