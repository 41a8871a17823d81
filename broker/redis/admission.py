"""Admission of subagents: depth, cluster-wide concurrency and children per parent, held in
Redis and decided in one atomic step (a Lua script), whichever orchestrator asks.

Running children hold a lease (a sorted set scored by expiry) that the orchestrator running
them renews; a child whose process died stops renewing and its slot is freed by the next
admission, so a crash never leaks a slot. A queued child holds a longer lease until an
orchestrator takes it (`RECLAIM`); a resumed child takes a slot again only if one is free.
A parent's children count until they are archived, as the seed says (finished ones too).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis
import redis.asyncio as aioredis

from broker import keys
from broker.config.settings import Settings

ADMIT = """
local now = tonumber(ARGV[7])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then  -- admitted before: its call ran again
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[8]), ARGV[1])
  return {1, 'admitted', redis.call('ZCARD', KEYS[1]), redis.call('SCARD', KEYS[2])}
end
local depth, max_depth = tonumber(ARGV[3]), tonumber(ARGV[4])
if depth > max_depth then return {0, 'depth', depth, max_depth} end
local running = redis.call('ZCARD', KEYS[1])
if running >= tonumber(ARGV[5]) then return {0, 'concurrency', running, tonumber(ARGV[5])} end
local children = redis.call('SCARD', KEYS[2])
if children >= tonumber(ARGV[6]) then return {0, 'children', children, tonumber(ARGV[6])} end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[8]), ARGV[1])
redis.call('SADD', KEYS[2], ARGV[1])
return {1, 'admitted', running + 1, children + 1}
"""


RECLAIM = """
local now = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), ARGV[1])
return 1
"""


@dataclass(frozen=True)
class Admission:
    admitted: bool
    limit: str  # admitted, depth, concurrency or children
    current: int
    maximum: int

    def message(self) -> str:
        """What a rejected spawn tells the model: the limit and the counts."""
        if self.admitted:
            return "admitted"
        what = {
            "depth": "subagents may not spawn deeper",
            "concurrency": "too many subagents are running across the cluster",
            "children": "this agent has too many subagents (finished ones count until archived)",
        }[self.limit]
        return f"spawn rejected: {what} ({self.limit}: {self.current} of {self.maximum})"


@dataclass(frozen=True)
class Limits:
    max_depth: int = 1
    max_concurrent: int = 8
    max_children: int = 5
    lease_s: float = 10.0


class SubagentSlots:
    def __init__(self, client: redis.Redis, limits: Limits) -> None:
        self.client = client
        self.limits = limits
        self._admit = client.register_script(ADMIT)

    def admit(self, child: str, parent: str, depth: int, now: float | None = None) -> Admission:
        """One round trip: admit `child` (at `depth`) under the session `parent`, or say
        which limit refuses it."""
        at = int((now if now is not None else time.time()) * 1000)
        lim = self.limits
        ok, limit, current, maximum = self._admit(
            keys=[keys.SUBAGENTS_RUNNING, keys.subagent_children(parent)],
            args=[
                child,
                parent,
                depth,
                lim.max_depth,
                lim.max_concurrent,
                lim.max_children,
                at,
                int(lim.lease_s * 1000),
            ],
        )
        return Admission(bool(ok), limit.decode(), int(current), int(maximum))

    def renew(self, children: list[str], now: float | None = None) -> None:
        """Extend the leases of running children (their orchestrator is alive)."""
        if children:
            expiry = int(((now if now is not None else time.time()) + self.limits.lease_s) * 1000)
            self.client.zadd(keys.SUBAGENTS_RUNNING, dict.fromkeys(children, expiry), xx=True)

    def release(self, child: str) -> None:
        """The child finished, failed or was cancelled: its running slot is free."""
        self.client.zrem(keys.SUBAGENTS_RUNNING, child)

    def archive(self, parent: str, child: str) -> None:
        """The child no longer counts against its parent."""
        self.client.srem(keys.subagent_children(parent), child)

    def running(self, now: float | None = None) -> int:
        at = int((now if now is not None else time.time()) * 1000)
        return int(self.client.zcount(keys.SUBAGENTS_RUNNING, at, "+inf"))


async def reclaim_slot(client: aioredis.Redis, job_id: str, settings: Settings) -> bool:
    """Keep the slot admission gave this subagent (or take a free one if it lapsed)."""
    now = int(time.time() * 1000)
    lease = int(settings.subagent_lease_s * 1000)
    limit = settings.max_concurrent_subagents
    return bool(await client.eval(RECLAIM, 1, keys.SUBAGENTS_RUNNING, job_id, now, limit, lease))
