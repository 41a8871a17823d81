"""The `agents` queue, consumed by orchestrators without kombu: a reliable list.

Agent runs are Celery task messages that producers (the client, chains, cron) LPUSH onto
the `agents` list through kombu's Redis transport. An orchestrator moves them, up to a
window at a time and in one Lua step, onto a list of its own (`taken`), and removes each
once its job is stored as accepted (or found not to be its to run). Nothing is lost in
between: the taken list of an orchestrator that stopped heartbeating goes back onto the
queue, whoever sees it first. What kombu's consumer did (a thread, a round trip per
message, another per ack) costs one round trip per batch here, on the event loop.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from broker import keys
from broker.protocol import AGENT_RUN_TASK, AGENTS_QUEUE

log = logging.getLogger("clawq.agents")

# KEYS: the queue, the taker's list; ARGV: how many at most. kombu consumes from the right.
TAKE = """
local out = {}
for i = 1, tonumber(ARGV[1]) do
  local m = redis.call('RPOP', KEYS[1])
  if not m then break end
  redis.call('LPUSH', KEYS[2], m)
  out[#out + 1] = m
end
return out
"""

# KEYS: the queue, a taker's list, the takers set and, for another taker, its presence key;
# ARGV: its id. The taker's list goes back on the queue (to be taken next), unless the
# presence key is given and the taker is alive (-1). A stopping taker gives its own.
GIVE_BACK = """
if #KEYS == 4 and redis.call('EXISTS', KEYS[4]) == 1 then return -1 end
local n = 0
while true do
  local m = redis.call('RPOP', KEYS[2])
  if not m then break end
  redis.call('RPUSH', KEYS[1], m)
  n = n + 1
end
redis.call('SREM', KEYS[3], ARGV[1])
return n
"""


@dataclass(frozen=True)
class AgentRun:
    raw: bytes  # the message as queued: what is removed from the taken list
    job_id: str  # "" when the message is not an agent run (it is dropped)
    chain: list[Any]  # the rest of its task graph


def parse(raw: bytes) -> AgentRun:
    """The job and chain of a kombu-enveloped Celery agent-run message."""
    try:
        envelope = json.loads(raw)
        body: Any = envelope["body"]
        if (envelope.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        decoded = json.loads(body)
        headers = envelope.get("headers") or {}
    except (ValueError, KeyError, TypeError):
        return AgentRun(raw, "", [])
    kwargs = decoded[1] if isinstance(decoded, list) and len(decoded) > 1 else {}
    embed = decoded[2] if isinstance(decoded, list) and len(decoded) > 2 else {}
    job_id = kwargs.get("job_id") if isinstance(kwargs, dict) else None
    if headers.get("task") != AGENT_RUN_TASK or not isinstance(job_id, str) or not job_id:
        return AgentRun(raw, "", [])
    return AgentRun(raw, job_id, list((embed or {}).get("chain") or []))


def _value(raw: bytes) -> Any:
    return raw  # redis-py sends bytes as they are (its stubs say str)


class AgentQueue:
    """One orchestrator's side of the queue."""

    def __init__(
        self,
        client: aioredis.Redis,
        blocking: aioredis.Redis,
        taker: str,
        queue: str = AGENTS_QUEUE,
    ) -> None:
        self.client = client
        self.blocking = blocking  # a connection of its own: the take waits on it
        self.taker = taker
        self.queue = queue
        self.taken = keys.agents_taken(taker)

    async def take(self, most: int, block_s: int) -> list[AgentRun]:
        """Up to `most` runs; waits up to `block_s` for the first when there are none."""
        if most <= 0:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.sadd(keys.AGENTS_TAKERS, self.taker)
            pipe.eval(TAKE, 2, self.queue, self.taken, most)
            found = (await pipe.execute())[-1]
        if not found and block_s > 0:
            first = await self.blocking.blmove(self.queue, self.taken, block_s, "RIGHT", "LEFT")
            if first is None:
                return []
            found = [first, *await self.client.eval(TAKE, 2, self.queue, self.taken, most - 1)]
        return [parse(raw) for raw in found]

    async def settle(self, runs: list[AgentRun]) -> None:
        """These runs are accepted (or not ours): they leave the taken list."""
        if runs:
            async with self.client.pipeline(transaction=False) as pipe:
                for run in runs:
                    pipe.lrem(self.taken, 1, _value(run.raw))
                await pipe.execute()

    async def retry(self, run: AgentRun) -> None:
        """Queue a run again (its accept failed here), behind those waiting."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.lrem(self.taken, 1, _value(run.raw))
            pipe.lpush(self.queue, run.raw)
            await pipe.execute()

    async def give_back(self) -> int:
        """Queue again what is taken and not settled (this orchestrator stops, or starts
        under the id of a dead one)."""
        restored = await self.client.eval(
            GIVE_BACK, 3, self.queue, self.taken, keys.AGENTS_TAKERS, self.taker
        )
        return int(restored)

    async def restore_dead(self) -> int:
        """Put back on the queue what orchestrators that stopped heartbeating had taken."""
        restored = 0
        for raw in await self.client.smembers(keys.AGENTS_TAKERS):
            taker = raw.decode() if isinstance(raw, bytes) else str(raw)
            if taker == self.taker:
                continue
            n = await self.client.eval(
                GIVE_BACK,
                4,
                self.queue,
                keys.agents_taken(taker),
                keys.AGENTS_TAKERS,
                keys.proc(taker),
                taker,
            )
            if n > 0:
                log.warning("%d agent runs taken by %s (gone) are queued again", n, taker)
                restored += n
        return restored
