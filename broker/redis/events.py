"""A job's events as a Redis stream: appended by the orchestrator, read resumably by clients.

An event need not cost a round trip of its own: `add` puts it in a pipeline that carries
other work (a task's publish, the checks that begin a turn), in the order it happened.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis

from broker import keys
from broker.protocol import Event

STREAM_MAXLEN = 10_000


def _fields(event: Event) -> dict[str, str]:
    return {"e": event.model_dump_json(exclude={"id"})}


def add(pipe: Any, batch: Iterable[Event], ttl_s: int | None) -> None:
    """Append these events to their streams within `pipe` (each stream's TTL set once;
    `ttl_s` None: not set, a writer that set it already)."""
    streams = []
    for event in batch:
        key = keys.events(event.job_id)
        pipe.xadd(key, _fields(event), maxlen=STREAM_MAXLEN, approximate=True)
        if key not in streams:
            streams.append(key)
    for key in streams if ttl_s is not None else ():
        pipe.expire(key, ttl_s)


async def emit(client: aioredis.Redis, event: Event, ttl_s: int) -> None:
    async with client.pipeline(transaction=False) as pipe:
        add(pipe, [event], ttl_s)
        await pipe.execute()


# KEYS: the job's cancel flag, steer list, inbox, event stream; ARGV: stream TTL, maxlen,
# the turn_started event. A cancelled job starts no turn; what was steered or delivered
# is taken (the caller stores it, then says the turn started); else the turn starts.
BEGIN_TURN = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {1, {}, {}} end
local steered = redis.call('LRANGE', KEYS[2], 0, -1)
local delivered = redis.call('LRANGE', KEYS[3], 0, -1)
if #steered > 0 or #delivered > 0 then
  redis.call('DEL', KEYS[2], KEYS[3])
  return {0, steered, delivered}
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], '*', 'e', ARGV[3])
redis.call('EXPIRE', KEYS[4], ARGV[1])
return {0, steered, delivered}
"""


@dataclass(frozen=True)
class TurnStart:
    cancelled: bool
    steered: list[str]  # the user's messages redirecting the job
    delivered: list[str]  # announcements delivered to its inbox

    @property
    def started(self) -> bool:
        """Whether `turn_started` was emitted (nothing to store first)."""
        return not (self.cancelled or self.steered or self.delivered)


async def begin_turn(
    client: aioredis.Redis, pending: list[Event], turn_started: Event, ttl_s: int
) -> TurnStart:
    """One round trip: the pending events, the cancel check, taking what was steered or
    delivered, and `turn_started` when there was nothing."""
    job = turn_started.job_id
    async with client.pipeline(transaction=False) as pipe:
        add(pipe, pending, ttl_s)
        pipe.eval(
            BEGIN_TURN,
            4,
            keys.cancel(job),
            keys.steer(job),
            keys.inbox(job),
            keys.events(job),
            ttl_s,
            STREAM_MAXLEN,
            _fields(turn_started)["e"],
        )
        cancelled, steered, delivered = (await pipe.execute())[-1]
    return TurnStart(bool(cancelled), _texts(steered), _texts(delivered))


def _texts(values: list[Any]) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


def emit_sync(client: redis.Redis, event: Event, ttl_s: int) -> None:
    pipe = client.pipeline(transaction=False)
    add(pipe, [event], ttl_s)
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
