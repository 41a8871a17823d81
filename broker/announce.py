"""The announce queue: finished children's results on their way back to the parent.

Per parent, results wait in a Redis list. Each arrival pushes the parent's due time to
`debounce` from now (so a burst is delivered together); at `drain_at` items the batch is
due at once. `take_due` atomically hands each due batch to exactly one orchestrator. Being
in Redis, announcements survive an orchestrator restart.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from broker import keys

PUSH = """
local n = redis.call('RPUSH', KEYS[1], ARGV[1])
local due = tonumber(ARGV[2]) + tonumber(ARGV[3])
if n >= tonumber(ARGV[4]) then due = tonumber(ARGV[2]) end
redis.call('ZADD', KEYS[2], due, ARGV[5])
return n
"""

TAKE = """
local out = {}
local parents = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, parent in ipairs(parents) do
  local list = ARGV[2] .. parent
  local items = redis.call('LRANGE', list, 0, -1)
  redis.call('DEL', list)
  redis.call('ZREM', KEYS[1], parent)
  table.insert(out, parent)
  table.insert(out, cjson.encode(items))
end
return out
"""


class AnnounceQueue:
    def __init__(self, client: redis.Redis, debounce_s: float = 1.0, drain_at: int = 20) -> None:
        self.client = client
        self.debounce_s = debounce_s
        self.drain_at = drain_at
        self._push = client.register_script(PUSH)
        self._take = client.register_script(TAKE)

    def push(self, parent: str, item: dict[str, Any], now: float | None = None) -> int:
        """Queue one child's result for `parent`; returns how many are waiting."""
        at = now if now is not None else time.time()
        return int(
            self._push(
                keys=[keys.announce(parent), keys.ANNOUNCE_DUE],
                args=[json.dumps(item), at, self.debounce_s, self.drain_at, parent],
            )
        )

    def take_due(
        self, now: float | None = None, limit: int = 100
    ) -> dict[str, list[dict[str, Any]]]:
        """Every batch now due, each to exactly one caller: parent → items in arrival order."""
        at = now if now is not None else time.time()
        flat = self._take(keys=[keys.ANNOUNCE_DUE], args=[at, keys.announce(""), limit])
        out: dict[str, list[dict[str, Any]]] = {}
        for parent, items in zip(flat[::2], flat[1::2], strict=True):
            name = parent.decode() if isinstance(parent, bytes) else parent
            out[name] = [json.loads(i) for i in json.loads(items)]
        return out

    def next_due(self) -> float | None:
        first = self.client.zrange(keys.ANNOUNCE_DUE, 0, 0, withscores=True)
        return float(first[0][1]) if first else None


def batch_message(items: list[dict[str, Any]]) -> str:
    """One message for the parent's conversation: a single result, or a numbered batch."""

    def one(item: dict[str, Any]) -> str:
        return f"[subagent {item.get('label') or item['child']} {item['status']}]\n{item['result']}"

    if len(items) == 1:
        return one(items[0])
    parts = [f"{n}. {one(item)}" for n, item in enumerate(items, start=1)]
    return f"{len(items)} subagents finished:\n\n" + "\n\n".join(parts)
