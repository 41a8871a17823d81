"""What clawq needs of its Redis, checked where an operator looks (`clawq status`).

The broker's queues, the hot ledger, the reply lists and the event streams live in Redis:
- without the append-only file (`appendonly no`) a Redis restart loses all of them (queued
  calls, the record of what ran: calls then run again);
- with a `maxmemory-policy` other than `noeviction`, a full Redis evicts keys: a ledger
  entry, a queued call, a lease, silently.
Both are read from INFO, which managed Redis services keep even when they rename CONFIG.
"""

from __future__ import annotations

from typing import Any

import redis


def redis_warnings(client: redis.Redis) -> tuple[dict[str, Any], list[str]]:
    """The settings found, and a warning for each one clawq cannot live with."""
    persistence = client.info("persistence")
    memory = client.info("memory")
    found = {
        "aof_enabled": bool(int(persistence.get("aof_enabled", 0))),
        "maxmemory_policy": str(memory.get("maxmemory_policy", "")),
    }
    warnings = []
    if not found["aof_enabled"]:
        warnings.append(
            "Redis has no append-only file (appendonly no): a restart loses queued calls and"
            " the ledger of what ran (calls would run again); set appendonly yes"
        )
    if found["maxmemory_policy"] not in ("", "noeviction"):
        warnings.append(
            f"Redis may evict keys (maxmemory-policy {found['maxmemory_policy']}): a ledger"
            " entry or a queued call would vanish; set maxmemory-policy noeviction"
        )
    return found, warnings
