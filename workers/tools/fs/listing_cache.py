"""What a worker process remembers of the routed files' listings (the context files and
memory at the workspace root, goclaw §3): without it, list_files asks PostgreSQL on every
call, a third process woken on a read's path (0.35 ms of a 2 ms turn in bench (i)).

An entry keeps the agent's token (`keys.routed_files`) as it was before its query. It is
answered only to a read running before its claim, which checks that token with the claim
(`ToolContext.rests_on`, `Ledger.begin_finish`): every write of the agent's routed files
sets a new token after its commit and before its outcome is recorded, so a listing that
missed a write is never recorded, and the read runs again, claimed, from PostgreSQL. A
token is never absent while an entry holds it (a fill makes one), so a Redis that lost its
keys matches no entry. An entry lasts `list_cache_s` at most: a change made around clawq's
writers (SQL by hand, or a write whose process died between its commit and its new token)
shows within that.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker import keys

if TYPE_CHECKING:
    import redis
    from redis.client import Pipeline

CAPACITY = 10_000  # entries per process, a few MB at most: the oldest go first


@dataclass(frozen=True)
class Entry:
    token: str  # the agent's routed-files token before the query
    names: tuple[str, ...]
    at: float  # monotonic, when the fill began


class ListingCache:
    """Listings by their query, the oldest dropped past `capacity`."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._entries: dict[Hashable, Entry] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, max_age: float) -> Entry | None:
        entry = self._entries.get(key)
        if entry is None or time.monotonic() - entry.at > max_age:
            return None
        return entry

    def put(self, key: Hashable, entry: Entry) -> None:
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = entry
            while len(self._entries) > self.capacity:
                del self._entries[next(iter(self._entries))]


def token(client: redis.Redis, agent_id: str) -> str:
    """The agent's routed-files token, made if it has none (one round trip)."""
    key = keys.routed_files(agent_id)
    pipe = client.pipeline(transaction=False)
    pipe.set(key, uuid.uuid4().hex, nx=True)
    pipe.get(key)
    _, found = pipe.execute()
    return found.decode() if isinstance(found, bytes) else str(found)


def changed(client: redis.Redis | Pipeline, agent_id: str) -> None:
    """The agent's routed files were written: a new token, so no cached listing of them
    is answered again."""
    client.set(keys.routed_files(agent_id), uuid.uuid4().hex)
