"""State the web workers share in Redis: a cache, and per search provider a circuit
breaker and a daily quota. Every web worker of the cluster sees the same counters, so a
quota holds across processes and a failing provider is skipped by all of them."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import zlib
from typing import Any

import redis

from broker.keys import PREFIX


def cache_key(kind: str, *parts: object) -> str:
    digest = hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]
    return f"{PREFIX}:web:{kind}:{digest}"


def cache_get(client: redis.Redis | None, key: str) -> Any:
    if client is None:
        return None
    try:
        raw = client.get(key)
    except redis.RedisError:
        return None
    return json.loads(zlib.decompress(raw)) if isinstance(raw, bytes) else None


def cache_put(client: redis.Redis | None, key: str, value: Any, ttl_s: int) -> None:
    if client is None or ttl_s <= 0:
        return
    with contextlib.suppress(redis.RedisError):  # a cache not written is only slower
        client.set(key, zlib.compress(json.dumps(value).encode(), 3), ex=ttl_s)


class Breaker:
    """Open (skipped) for `cooldown_s` after `failures` failures in a row; a success
    closes it. Shared by every worker through two keys per provider."""

    def __init__(self, client: redis.Redis, provider: str, failures: int, cooldown_s: float):
        self.client = client
        self.failures = failures
        self.cooldown_ms = int(cooldown_s * 1000)
        self.count_key = f"{PREFIX}:web:breaker:{provider}:failures"
        self.open_key = f"{PREFIX}:web:breaker:{provider}:open"

    def is_open(self) -> float:
        """Seconds until it closes again (0: closed)."""
        left = self.client.pttl(self.open_key)
        return max(int(left), 0) / 1000 if isinstance(left, int) else 0.0

    def failed(self) -> None:
        pipe = self.client.pipeline()
        pipe.incr(self.count_key)
        pipe.pexpire(self.count_key, self.cooldown_ms * 10)
        count = int(pipe.execute()[0])
        if count >= self.failures:
            pipe = self.client.pipeline()
            pipe.set(self.open_key, "1", px=self.cooldown_ms)
            pipe.delete(self.count_key)
            pipe.execute()

    def succeeded(self) -> None:
        self.client.delete(self.count_key)


def utc_day() -> str:
    """Today in UTC (`YYYYMMDD`): the quotas' day, which tests pin."""
    return time.strftime("%Y%m%d", time.gmtime())


class Quota:
    """At most `per_day` uses a UTC day, counted in Redis across every worker."""

    def __init__(self, client: redis.Redis, provider: str, per_day: int) -> None:
        self.client = client
        self.per_day = per_day
        self.key = f"{PREFIX}:web:quota:{provider}:{utc_day()}"

    def take(self) -> bool:
        """Count one use; False (and nothing counted) when the day's quota is spent."""
        pipe = self.client.pipeline()
        pipe.incr(self.key)
        pipe.expire(self.key, 2 * 86400)
        used = int(pipe.execute()[0])
        if used > self.per_day:
            self.client.decr(self.key)
            return False
        return True
