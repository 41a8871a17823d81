"""Redis clients for asyncio processes: a bounded pool that waits instead of failing.

redis-py's default asyncio pool raises "Too many connections" when thousands of jobs
publish at once; a blocking pool queues them on a fixed number of connections.
"""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis

from broker.config.settings import Settings
from broker.redis.autopipe import batching

log = logging.getLogger("clawq.redis")


def async_redis(settings: Settings) -> aioredis.Redis:
    """The orchestrator's client: what its jobs send in one pass of the event loop goes
    as one pipeline (broker/redis/autopipe.py)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        settings.redis_url, max_connections=settings.redis_max_connections, timeout=30
    )
    return batching(pool)  # the client owns the pool: aclose() closes it


async def retry_pause(exc: Exception, what: str, delay_s: float = 0.5) -> None:
    """After a Redis error in a long-lived loop: log it and wait before the next try.

    redis-py can turn a cancellation that lands in a blocking read into a connection
    error; a loop that swallowed it would never stop, so a pending cancel is re-raised.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc
    log.warning("%s: %s; retrying", what, exc)
    await asyncio.sleep(delay_s)
