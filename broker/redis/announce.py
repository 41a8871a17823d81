"""The announce queue: finished children's results (and sessions_send messages) on their way
to a session.

Per session, items wait in a Redis list. Each arrival pushes the session's due time to
`debounce` from now (so a burst is delivered together); at `drain_at` items the batch is
due at once. An orchestrator *claims* a due batch (its due time moves `hold_s` ahead, so a
claimer that dies leaves it to another) and removes the items only once they are delivered:
into the inbox of the job running in the session, atomically, or as a new job of the
session. Being in Redis, nothing waits in an orchestrator's memory.
"""

from __future__ import annotations

import json
import time
from typing import Literal

import redis
from pydantic import BaseModel

from broker import keys


class AnnounceItem(BaseModel):
    """One arrival: a child's result, or a message another session sent."""

    kind: Literal["subagent", "message", "text"] = "subagent"  # text: already formatted
    child: str = ""  # the child job (subagent)
    parent_job: str = ""  # the job that spawned it
    label: str = ""
    status: str = ""
    result: str = ""
    sender: str = ""  # the sending session (message)


PUSH = """
local n = redis.call('RPUSH', KEYS[1], ARGV[1])
local due = tonumber(ARGV[2]) + tonumber(ARGV[3])
if n >= tonumber(ARGV[4]) then due = tonumber(ARGV[2]) end
redis.call('ZADD', KEYS[2], due, ARGV[5])
return n
"""

CLAIM = """
local out = {}
local limit = tonumber(ARGV[3])
local sessions = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, limit)
for _, session in ipairs(sessions) do
  local items = redis.call('LRANGE', ARGV[2] .. session, 0, -1)
  if #items == 0 then
    redis.call('ZREM', KEYS[1], session)
  else
    redis.call('ZADD', KEYS[1], tonumber(ARGV[1]) + tonumber(ARGV[4]), session)
    table.insert(out, session)
    table.insert(out, cjson.encode(items))
  end
end
return out
"""

# KEYS: announce list, due set, the session's active-job key; ARGV: n delivered, session,
# inbox prefix, message, inbox ttl, control channel. Delivers to the running job (and tells
# its orchestrator: its next turn reads the inbox), or answers nil.
DELIVER = """
local job = redis.call('GET', KEYS[3])
if not job then return false end
local inbox = ARGV[3] .. job
redis.call('RPUSH', inbox, ARGV[4])
redis.call('EXPIRE', inbox, tonumber(ARGV[5]))
redis.call('PUBLISH', ARGV[6], cjson.encode({inbox = job}))
redis.call('LTRIM', KEYS[1], tonumber(ARGV[1]), -1)
if redis.call('LLEN', KEYS[1]) == 0 then redis.call('ZREM', KEYS[2], ARGV[2]) end
return job
"""

# KEYS: announce list, due set, the job's inbox, its released flag; ARGV: n, session,
# message, inbox ttl, control channel, job. Into the inbox of a job that has not ended
# (else 0: try again soon), its orchestrator told.
DELIVER_TO_JOB = """
if redis.call('EXISTS', KEYS[4]) == 1 then return 0 end
redis.call('RPUSH', KEYS[3], ARGV[3])
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[4]))
redis.call('PUBLISH', ARGV[5], cjson.encode({inbox = ARGV[6]}))
redis.call('LTRIM', KEYS[1], tonumber(ARGV[1]), -1)
if redis.call('LLEN', KEYS[1]) == 0 then redis.call('ZREM', KEYS[2], ARGV[2]) end
return 1
"""

ACK = """
redis.call('LTRIM', KEYS[1], tonumber(ARGV[1]), -1)
if redis.call('LLEN', KEYS[1]) == 0 then redis.call('ZREM', KEYS[2], ARGV[2]) end
return 1
"""

# KEYS: the job's inbox, its steer list, the session's active-job key; ARGV: job id.
# A job may end only with nothing waiting for it; then the session has no running job.
CLOSE = """
if redis.call('LLEN', KEYS[1]) > 0 or redis.call('LLEN', KEYS[2]) > 0 then return 0 end
if redis.call('GET', KEYS[3]) == ARGV[1] then redis.call('DEL', KEYS[3]) end
return 1
"""


# KEYS: the session's active-job key, the job's inbox, its released flag; ARGV: job id,
# ttl. The job has ended: the session has no running job, what waited in its inbox is
# handed back, and nothing more can be put there.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
redis.call('SET', KEYS[3], 1, 'EX', tonumber(ARGV[2]))
local left = redis.call('LRANGE', KEYS[2], 0, -1)
redis.call('DEL', KEYS[2])
return left
"""


class AnnounceQueue:
    def __init__(
        self,
        client: redis.Redis,
        debounce_s: float = 1.0,
        drain_at: int = 20,
        hold_s: float = 30.0,
        inbox_ttl_s: int = 7 * 24 * 3600,
    ) -> None:
        self.client = client
        self.debounce_s = debounce_s
        self.drain_at = drain_at
        self.hold_s = hold_s
        self.inbox_ttl_s = inbox_ttl_s
        self._push = client.register_script(PUSH)
        self._claim = client.register_script(CLAIM)
        self._deliver = client.register_script(DELIVER)
        self._ack = client.register_script(ACK)
        self._deliver_to_job = client.register_script(DELIVER_TO_JOB)

    def push(self, session: str, item: AnnounceItem, now: float | None = None) -> int:
        """Queue one item for `session`; returns how many are waiting."""
        at = now if now is not None else time.time()
        return int(
            self._push(
                keys=[keys.announce(session), keys.ANNOUNCE_DUE],
                args=[item.model_dump_json(), at, self.debounce_s, self.drain_at, session],
            )
        )

    def claim_due(
        self, now: float | None = None, limit: int = 100
    ) -> dict[str, list[AnnounceItem]]:
        """Every batch now due, each to exactly one caller: session → items in arrival
        order. The items stay queued until `deliver` or `ack`; unacknowledged, they are due
        again `hold_s` later."""
        at = now if now is not None else time.time()
        flat = self._claim(
            keys=[keys.ANNOUNCE_DUE], args=[at, keys.announce(""), limit, self.hold_s]
        )
        out: dict[str, list[AnnounceItem]] = {}
        for session, items in zip(flat[::2], flat[1::2], strict=True):
            name = session.decode() if isinstance(session, bytes) else session
            out[name] = [AnnounceItem.model_validate_json(i) for i in json.loads(items)]
        return out

    def deliver(self, session: str, count: int, message: str) -> str | None:
        """Hand `message` (the first `count` items) to the job running in `session`, in one
        step; None when no job runs there (the caller then starts one and calls `ack`)."""
        job = self._deliver(
            keys=[keys.announce(session), keys.ANNOUNCE_DUE, keys.session_active(session)],
            args=[
                count,
                session,
                keys.inbox(""),
                message,
                self.inbox_ttl_s,
                keys.CONTROL_CHANNEL,
            ],
        )
        if not job:
            return None
        return job.decode() if isinstance(job, bytes) else str(job)

    def deliver_to_job(self, job_id: str, session: str, count: int, message: str) -> bool:
        """Hand `message` to a job of `session` that has not started its run yet (or is
        about to end); False once it has ended (its inbox is closed)."""
        done = self._deliver_to_job(
            keys=[
                keys.announce(session),
                keys.ANNOUNCE_DUE,
                keys.inbox(job_id),
                keys.released(job_id),
            ],
            args=[count, session, message, self.inbox_ttl_s, keys.CONTROL_CHANNEL, job_id],
        )
        return bool(done)

    def retry_soon(self, session: str, after_s: float = 0.5, now: float | None = None) -> None:
        """A claimed batch that could not be delivered yet is due again shortly."""
        at = now if now is not None else time.time()
        self.client.zadd(keys.ANNOUNCE_DUE, {session: at + after_s})

    def ack(self, session: str, count: int) -> None:
        """The first `count` items of `session` are delivered."""
        self._ack(keys=[keys.announce(session), keys.ANNOUNCE_DUE], args=[count, session])

    def next_due(self) -> float | None:
        first = self.client.zrange(keys.ANNOUNCE_DUE, 0, 0, withscores=True)
        return float(first[0][1]) if first else None


def batch_message(items: list[AnnounceItem]) -> str:
    """One message for the conversation: a single item, or a numbered batch."""

    def one(item: AnnounceItem) -> str:
        if item.kind == "text":
            return item.result
        if item.kind == "message":
            return f"[message from session {item.sender}]\n{item.result}"
        return f"[subagent {item.label or item.child} {item.status}]\n{item.result}"

    if len(items) == 1:
        return one(items[0])
    if all(item.kind == "subagent" for item in items):
        head = f"{len(items)} subagents finished:"
    else:
        head = f"{len(items)} announcements:"
    parts = [f"{n}. {one(item)}" for n, item in enumerate(items, start=1)]
    return head + "\n\n" + "\n\n".join(parts)
