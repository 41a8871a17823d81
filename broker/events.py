"""A job's events as a Redis stream: appended by the orchestrator, read resumably by clients."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import redis
import redis.asyncio as aioredis

from broker import keys
from broker.messages import Event

STREAM_MAXLEN = 10_000


def _fields(event: Event) -> dict[str, str]:
    return {"e": event.model_dump_json(exclude={"id"})}


async def emit(client: aioredis.Redis, event: Event, ttl_s: int) -> None:
    key = keys.events(event.job_id)
    async with client.pipeline(transaction=False) as pipe:
        pipe.xadd(key, _fields(event), maxlen=STREAM_MAXLEN, approximate=True)  # type: ignore[arg-type]
        pipe.expire(key, ttl_s)
        await pipe.execute()


def emit_sync(client: redis.Redis, event: Event, ttl_s: int) -> None:
    key = keys.events(event.job_id)
    pipe = client.pipeline(transaction=False)
    pipe.xadd(key, _fields(event), maxlen=STREAM_MAXLEN, approximate=True)  # type: ignore[arg-type]
    pipe.expire(key, ttl_s)
    pipe.execute()


def _parse(entry_id: Any, fields: dict[Any, Any]) -> Event:
    event = Event.model_validate_json(fields[b"e"])
    event.id = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return event


def read(
    client: redis.Redis, job_id: str, after: str | None = None, block_ms: int = 1000
) -> Iterator[Event]:
    """Events after `after` (a stream id), blocking for new ones until a batch arrives.

    Yields what exists now and returns after one blocking read with nothing new.
    """
    last = after or "0-0"
    key = keys.events(job_id)
    while True:
        batch: Any = client.xread({key: last}, count=500, block=block_ms)
        if not batch:
            return
        for entry_id, fields in batch[0][1]:
            event = _parse(entry_id, fields)
            last = event.id
            yield event
