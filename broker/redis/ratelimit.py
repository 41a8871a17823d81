"""Per-session tool-call rate limiting (goclaw §9), shared by every process through Redis.

A sliding window log: one sorted set per session, scored by time; a call is admitted only
if fewer than `limit` calls were admitted in the last `window_s` seconds. One Lua call,
which for a tool call also sends it when admitted (`push`): the check costs the call no
round trip of its own.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis

from broker import keys
from broker.protocol import Event
from broker.redis.events import STREAM_MAXLEN

# KEYS[1]: the window; ARGV: now, window, limit, a member for this use
WINDOW = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1] - ARGV[2])
local used = redis.call('ZCARD', KEYS[1])
if used >= tonumber(ARGV[3]) then return {0, used} end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])))
"""
ADMIT = WINDOW + "return {1, used + 1}"
# and, admitted: KEYS[2] the queue, KEYS[3] the job's event stream; ARGV[5] the task
# message, ARGV[6] its `tool_call_queued` event, ARGV[7] the stream's length, ARGV[8] its TTL
ADMIT_AND_PUSH = (
    WINDOW
    + """
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[7], '*', 'e', ARGV[6])
redis.call('EXPIRE', KEYS[3], ARGV[8])
redis.call('LPUSH', KEYS[2], ARGV[5])
return {1, used + 1}
"""
)


class RateLimiter:
    def __init__(self, client: aioredis.Redis, limit: int, window_s: float = 3600.0) -> None:
        self.limit = limit
        self.window_s = window_s
        self._admit = client.register_script(ADMIT)

    async def admit(self, session_key: str) -> tuple[bool, int]:
        """(admitted, calls in the window including this one if admitted)."""
        if self.limit <= 0:
            return True, 0
        ok, used = await self._admit(
            keys=[keys.rate(session_key)],
            args=[time.time(), self.window_s, self.limit, uuid.uuid4().hex],
        )
        return bool(ok), int(used)

    def push(
        self, session_key: str, queued: Event, ttl_s: int
    ) -> Callable[[Any, str, str], None] | None:
        """How a call's message is pushed when this limit admits it, with its queued
        event (the pipeline's last reply is then (admitted, used)); None: no limit."""
        if self.limit <= 0:
            return None
        event = queued.model_dump_json(exclude={"id"})

        def admitted_push(pipe: Any, queue: str, message: str) -> None:
            pipe.eval(
                ADMIT_AND_PUSH,
                3,
                keys.rate(session_key),
                queue,
                keys.events(queued.job_id),
                time.time(),
                self.window_s,
                self.limit,
                uuid.uuid4().hex,
                message,
                event,
                STREAM_MAXLEN,
                ttl_s,
            )

        return admitted_push


# the same window, answering how long until a slot frees when it is full
ADMIT_OR_WAIT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1] - ARGV[2])
local used = redis.call('ZCARD', KEYS[1])
if used >= tonumber(ARGV[3]) then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, tostring(tonumber(oldest[2]) + tonumber(ARGV[2]) - tonumber(ARGV[1]))}
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])))
return {1, '0'}
"""


class SyncWindow:
    """The sliding window for worker threads: `take` admits one use, or says how many
    seconds until the oldest use leaves the window."""

    def __init__(self, client: redis.Redis, key: str, limit: int, window_s: float) -> None:
        self.key, self.limit, self.window_s = key, limit, window_s
        self._admit = client.register_script(ADMIT_OR_WAIT)

    def take(self) -> tuple[bool, float]:
        ok, wait = self._admit(
            keys=[self.key], args=[time.time(), self.window_s, self.limit, uuid.uuid4().hex]
        )
        return bool(ok), max(0.0, float(wait))
