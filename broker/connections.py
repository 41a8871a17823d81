"""Redis clients for asyncio processes: a bounded pool that waits instead of failing.

redis-py's default asyncio pool raises "Too many connections" when thousands of jobs
publish at once; a blocking pool queues them on a fixed number of connections.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from broker.settings import Settings


def async_redis(settings: Settings) -> aioredis.Redis:
    pool = aioredis.BlockingConnectionPool.from_url(
        settings.redis_url, max_connections=settings.redis_max_connections, timeout=30
    )
    return aioredis.Redis(connection_pool=pool)
