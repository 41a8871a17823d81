"""Commands pushed to every orchestrator on the control channel: approvals' answers, cancel
and steer. A missed push is still seen: a job checks its cancel key before every turn, and
an approval's answer is also stored."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from broker import keys
from broker.redis.connections import retry_pause
from orchestrator.services.service import Service


class ControlChannel(Service):
    name = "control channel"

    def __init__(self, redis: aioredis.Redis, on_command: Callable[[dict[str, Any]], None]) -> None:
        super().__init__()
        self.redis = redis
        self.on_command = on_command

    async def run(self) -> None:
        while True:
            try:
                pubsub = self.redis.pubsub()
                await pubsub.subscribe(keys.CONTROL_CHANNEL)
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        self.on_command(json.loads(message["data"]))
            except aioredis.RedisError as exc:
                await retry_pause(exc, "control channel")
