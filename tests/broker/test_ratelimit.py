"""The sliding-window rate limiter against a real Redis, shared by two clients."""

from __future__ import annotations

import asyncio
import json
import time

import redis.asyncio as aioredis

from broker import keys
from broker.protocol import Event
from broker.redis.ratelimit import RateLimiter
from tests.conftest import Isolated


def test_limit_is_shared_and_the_window_slides(isolated: Isolated) -> None:
    async def scenario() -> list[tuple[bool, int]]:
        one = aioredis.Redis.from_url(isolated.redis_url)
        two = aioredis.Redis.from_url(isolated.redis_url)  # another process, in effect
        first = RateLimiter(one, limit=3, window_s=1.0)
        second = RateLimiter(two, limit=3, window_s=1.0)
        seen = [
            await first.admit("s"),
            await second.admit("s"),
            await first.admit("s"),
            await second.admit("s"),
            await first.admit("other"),
        ]
        await asyncio.sleep(1.1)
        seen.append(await second.admit("s"))
        await one.aclose()
        await two.aclose()
        return seen

    started = time.monotonic()
    assert asyncio.run(scenario()) == [
        (True, 1),
        (True, 2),
        (True, 3),
        (False, 3),
        (True, 1),
        (True, 1),
    ]
    assert time.monotonic() - started < 5


def test_zero_means_off(isolated: Isolated) -> None:
    async def scenario() -> bool:
        client = aioredis.Redis.from_url(isolated.redis_url)
        limiter = RateLimiter(client, limit=0)
        results = [(await limiter.admit("s"))[0] for _ in range(5)]
        await client.aclose()
        return all(results)

    assert asyncio.run(scenario())


def test_a_call_is_pushed_with_its_event_only_when_admitted(isolated: Isolated) -> None:
    """The check and the send are one script: a refused call leaves neither its message in
    the queue nor its queued event in the stream, and uses up no slot."""

    async def scenario() -> list[object]:
        client = aioredis.Redis.from_url(isolated.redis_url)
        limiter = RateLimiter(client, limit=2, window_s=60.0)
        replies = []
        for n in range(3):
            queued = Event(type="tool_call_queued", job_id="j", data={"call_id": f"c{n}"})
            push = limiter.push("s", queued, ttl_s=60)
            assert push is not None
            async with client.pipeline(transaction=False) as pipe:
                push(pipe, "fs", f"message {n}")
                replies.append((await pipe.execute())[-1])
        queue = await client.lrange("fs", 0, -1)
        events = [
            json.loads(f[b"e"])["data"]["call_id"] for _, f in await client.xrange(keys.events("j"))
        ]
        await client.aclose()
        return [replies, queue, events, RateLimiter(client, limit=0).push("s", queued, 60)]

    replies, queue, events, off = asyncio.run(scenario())
    assert replies == [[1, 1], [1, 2], [0, 2]]
    assert queue == [b"message 1", b"message 0"]
    assert events == ["c0", "c1"]
    assert off is None  # no limit: the caller pushes as it would without one
