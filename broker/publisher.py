"""Publish Celery task messages from asyncio without blocking the event loop.

kombu is synchronous (about 1 ms a publish, most of it Python layers), and one orchestrator
drives thousands of jobs on one event loop. Celery builds the protocol-2 message
(`app.amqp.as_task_v2`); this module wraps it in kombu's Redis-transport envelope and
LPUSHes it with redis.asyncio: exactly what kombu's `Channel._put` writes for priority 0, so
real Celery workers consume it unchanged (every integration test proves that).
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import redis.asyncio as aioredis
from celery import Celery


def task_message(
    app: Celery,
    *,
    name: str,
    queue: str,
    kwargs: dict[str, Any],
    task_id: str | None = None,
    time_limit: float | None = None,
    soft_time_limit: float | None = None,
    root_id: str | None = None,
    parent_id: str | None = None,
    kwargsrepr: str | None = None,
) -> str:
    """The JSON string that kombu's Redis transport stores for this task on `queue`."""
    task_id = task_id or str(uuid.uuid4())
    msg = app.amqp.as_task_v2(
        task_id,
        name,
        args=(),
        kwargs=kwargs,
        time_limit=time_limit,
        soft_time_limit=soft_time_limit,
        root_id=root_id or task_id,
        parent_id=parent_id,
        kwargsrepr=kwargsrepr,
    )
    body = json.dumps(msg.body, separators=(",", ":")).encode()
    properties = dict(msg.properties)
    properties.update(
        priority=0,
        body_encoding="base64",
        delivery_tag=str(uuid.uuid4()),
        delivery_info={"exchange": "", "routing_key": queue},
    )
    envelope = {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": msg.headers,
        "properties": properties,
    }
    return json.dumps(envelope, separators=(",", ":"))


class AsyncPublisher:
    """Sends prepared task messages to their queues over one asyncio Redis client."""

    def __init__(self, app: Celery, redis: aioredis.Redis) -> None:
        self.app = app
        self.redis = redis

    async def send(self, *, name: str, queue: str, kwargs: dict[str, Any], **options: Any) -> str:
        task_id = options.pop("task_id", None) or str(uuid.uuid4())
        raw = task_message(
            self.app, name=name, queue=queue, kwargs=kwargs, task_id=task_id, **options
        )
        await self.redis.lpush(queue, raw)
        return task_id
