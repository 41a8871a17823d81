"""The sliding-window rate limiter against a real Redis, shared by two clients."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from broker.ratelimit import RateLimiter
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
