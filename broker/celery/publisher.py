"""Publish Celery task messages from asyncio without blocking the event loop.

kombu is synchronous (about 1 ms a publish, most of it Python layers), and one orchestrator
drives thousands of jobs on one event loop. Celery builds the protocol-2 message
(`app.amqp.as_task_v2`); this module wraps it in kombu's Redis-transport envelope and
LPUSHes it with redis.asyncio: exactly what kombu's `Channel._put` writes for priority 0, so
real Celery workers consume it unchanged (every integration test proves that).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from celery import Celery
from kombu.connection import Connection
from kombu.utils import json as kombu_json

from broker import fastjson
from broker.celery import transport


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
        argsrepr="()",  # what Celery's saferepr makes of no args, without making it
        kwargsrepr=kwargsrepr,
    )
    body = fastjson.dumps_bytes(msg.body)
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
    return fastjson.dumps(envelope)


class AsyncPublisher:
    """Sends prepared task messages to their queues over one asyncio Redis client."""

    def __init__(self, app: Celery, redis: aioredis.Redis) -> None:
        self.app = app
        self.redis = redis

    async def send(
        self,
        *,
        name: str,
        queue: str,
        kwargs: dict[str, Any],
        prelude: Callable[[Any], None] | None = None,
        push: Callable[[Any, str, str], None] | None = None,
        **options: Any,
    ) -> Any:
        """Publish one task; `prelude` adds commands (events) that go first in the same
        round trip, and `push` adds the one that pushes the message (a plain LPUSH
        otherwise). The push's reply."""
        raw = self.message(name=name, queue=queue, kwargs=kwargs, **options)
        return await self.push(queue, raw, prelude, push)

    def message(self, *, name: str, queue: str, kwargs: dict[str, Any], **options: Any) -> str:
        """The message as it will sit in its queue (a watchdog looks for it there)."""
        task_id = options.pop("task_id", None) or str(uuid.uuid4())
        return task_message(
            self.app, name=name, queue=queue, kwargs=kwargs, task_id=task_id, **options
        )

    async def push(
        self,
        queue: str,
        raw: str,
        prelude: Callable[[Any], None] | None = None,
        push: Callable[[Any, str, str], None] | None = None,
    ) -> Any:
        async with self.redis.pipeline(transaction=False) as pipe:
            if prelude is not None:
                prelude(pipe)
            if push is None:
                pipe.lpush(queue, raw)
            else:
                push(pipe, queue, raw)
            return (await pipe.execute())[-1]


class _Capturing(transport.Channel):
    """kombu's Redis channel, except that a fanout publish (how Celery events travel) is
    kept as (topic, payload) instead of sent."""

    captured: list[tuple[str, str]]

    def _put_fanout(self, exchange: Any, message: Any, routing_key: Any, **kwargs: Any) -> None:
        payload = kombu_json.dumps(message)  # type: ignore[no-untyped-call]
        topics = self._get_publish_topics(exchange, routing_key)  # type: ignore[no-untyped-call]
        self.captured.extend((topic, payload) for topic in topics)


class _CapturingTransport(transport.Transport):
    Channel = _Capturing


class _Kept:
    """A producer, as `EventDispatcher.publish` takes one, that keeps the event it is given
    instead of publishing it."""

    event: dict[str, Any] = {}

    def publish(self, event: dict[str, Any], **_: Any) -> None:
        self.event = event


class EventMessages:
    """Celery events (for Flower) as Celery and kombu make them, to be sent by asyncio.

    Celery's own dispatcher builds each event (clock, hostname, pid). The first event of
    each type goes through kombu, over a channel that keeps what it would publish (topic
    and message); the later ones are that message with their own body and delivery tag,
    which is all that differs between two events of a type (kombu's Producer took 50 us an
    event, 6% of an orchestrator's CPU in bench (j)). The caller sends the PUBLISHes in a
    pipeline it makes anyway, so an event costs no round trip, no thread and no
    synchronous socket of its own."""

    def __init__(self, app: Celery, hostname: str) -> None:
        self.app = app
        self.hostname = hostname
        self._dispatcher: Any = None
        self._models: dict[str, tuple[str, dict[str, Any]]] = {}  # type → topic, message
        self._kept = _Kept()

    def build(self, events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
        """(topic, payload) for each event (type, fields), in order."""
        if self._dispatcher is None:  # the channel pings Redis once, as it is made
            connection = Connection(  # type: ignore[no-untyped-call]
                self.app.conf.broker_url,
                transport=_CapturingTransport,
                transport_options=self.app.conf.broker_transport_options,
            )
            self._dispatcher = self.app.events.Dispatcher(
                connection, hostname=self.hostname, enabled=True
            )
        built: list[tuple[str, str]] = []
        for type_, fields in events:
            if (model := self._models.get(type_)) is None:
                built.extend(self._through_kombu(type_, fields))
                continue
            self._dispatcher.publish(type_, fields, self._kept)
            topic, message = model
            body = base64.b64encode(fastjson.dumps_bytes(self._kept.event)).decode()
            properties = {**message["properties"], "delivery_tag": str(uuid.uuid4())}
            built.append(
                (topic, fastjson.dumps({**message, "body": body, "properties": properties}))
            )
        return built

    def _through_kombu(self, type_: str, fields: dict[str, Any]) -> list[tuple[str, str]]:
        """The event as kombu publishes it; a type published to one topic is kept as the
        model of its later events."""
        channel = self._dispatcher.producer.channel
        channel.captured = []
        self._dispatcher.send(type_, **fields)
        if len(channel.captured) == 1:
            topic, payload = channel.captured[0]
            self._models[type_] = (topic, kombu_json.loads(payload))  # type: ignore[no-untyped-call]
        return list(channel.captured)

    def close(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.close()
            self._dispatcher.connection.close()
