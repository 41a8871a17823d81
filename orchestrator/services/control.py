"""Commands pushed to every orchestrator on the control channel: approvals' answers, cancel,
steer, and an announcement handed to a running job. A missed push is still seen: a job
reads its cancel flag and inbox in Redis at least every `turn_check_s`, and whenever the
channel was not listening since its last look; an approval's answer is also stored."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from broker import keys
from broker.redis.connections import retry_pause
from orchestrator.services.service import Service


class Heard:
    """What this process's control channel has heard, for the turns that start on its word:
    since when it has listened without a break, and which jobs were handed an announcement
    since their last look at Redis. A cancel or a steer comes as a push (and stops the job's
    work at once), so a job that looked after the channel began listening, and was handed
    nothing since, starts its turn without a round trip of its own."""

    def __init__(self, check_every_s: float) -> None:
        self.check_every_s = check_every_s
        self.since: float | None = None  # monotonic; None while not listening
        self.handed: set[str] = set()  # jobs with an announcement in their inbox

    def listening(self) -> None:
        self.since = time.monotonic()

    def deaf(self) -> None:
        self.since = None

    def nothing_new(self, job_id: str, looked_at: float) -> bool:
        """Whether a job that last looked at Redis at `looked_at` (monotonic, as its look
        was sent) would find nothing new there, by what the channel heard."""
        return (
            self.since is not None
            and self.since <= looked_at
            and time.monotonic() - looked_at < self.check_every_s
            and job_id not in self.handed
        )


class ControlChannel(Service):
    name = "control channel"

    def __init__(
        self,
        redis: aioredis.Redis,
        on_command: Callable[[dict[str, Any]], None],
        heard: Heard,
    ) -> None:
        super().__init__()
        self.redis = redis
        self.on_command = on_command
        self.heard = heard

    async def run(self) -> None:
        while True:
            try:
                pubsub = self.redis.pubsub()
                await pubsub.subscribe(keys.CONTROL_CHANNEL)
                async for message in pubsub.listen():
                    if message.get("type") == "subscribe":  # what is published now is heard
                        self.heard.listening()
                    elif message.get("type") == "message":
                        self.on_command(json.loads(message["data"]))
            except aioredis.RedisError as exc:
                self.heard.deaf()
                await retry_pause(exc, "control channel")
            finally:
                self.heard.deaf()
