"""Redis clients for asyncio processes: a bounded pool that waits instead of failing.

redis-py's default asyncio pool raises "Too many connections" when thousands of jobs
publish at once; a blocking pool queues them on a fixed number of connections.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from broker.config.settings import Settings
from broker.redis.autopipe import batching

log = logging.getLogger("clawq.redis")


def async_redis(settings: Settings) -> aioredis.Redis:
    """The orchestrator's client: what its jobs send in one pass of the event loop goes
    as one pipeline (broker/redis/autopipe.py), sent again while Redis is away (up to
    `outage_retry_s`)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        settings.redis_url, max_connections=settings.redis_max_connections, timeout=30
    )
    return batching(pool, outage_s=settings.outage_retry_s)  # aclose() closes the pool


def patient_redis(url: str, outage_s: float, **options: object) -> redis.Redis:
    """A synchronous client whose commands wait for a Redis that is away (up to about
    `outage_s`, a second between tries) instead of failing: for what must not be dropped
    (the announce queue)."""
    retry = Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=max(1, int(outage_s)))
    return redis.Redis.from_url(
        url,
        retry=retry,
        retry_on_error=[redis.ConnectionError, redis.TimeoutError, ConnectionError],
        **options,
    )


def reconnecting_redis(url: str, **options: Any) -> aioredis.Redis:
    """An asyncio client for requests that must not hang: a connection Redis closed (it
    restarted) is opened again and the command sent again, at once; a Redis that is away
    fails within a second. (redis-py's `from_url` pools retry nothing.)"""
    return aioredis.Redis.from_url(
        url,
        retry=AsyncRetry(ExponentialBackoff(cap=0.25, base=0.02), retries=3),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError, ConnectionError],
        **options,
    )


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
