"""What clawq needs of its Redis, checked where an operator looks (`clawq status`).

The broker's queues, the hot ledger, the reply lists and the event streams live in Redis:
- without the append-only file (`appendonly no`) a Redis restart loses all of them (queued
  calls, the record of what ran: calls then run again);
- with a `maxmemory-policy` other than `noeviction`, a full Redis evicts keys: a ledger
  entry, a queued call, a lease, silently;
- a Redis older than 7.0 lacks BLMPOP, which an orchestrator's reply listener reads with:
  the orchestrator refuses to start on one (`require_version`).
All are read from INFO, which managed Redis services keep even when they rename CONFIG.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis

MIN_VERSION = (7, 0)


def too_old(version: str) -> str:
    """Why a Redis of this version cannot serve clawq ("" when it can)."""
    major_minor = tuple(int(part) for part in version.split(".")[:2])
    if major_minor >= MIN_VERSION:
        return ""
    return (
        f"Redis {version} is too old: clawq needs Redis 7.0 or later (an orchestrator reads"
        " its replies with BLMPOP)"
    )


async def require_version(client: aioredis.Redis) -> None:
    """Refuse to start on a Redis that lacks a command this process relies on (one that
    cannot be reached now is not judged: the process waits for it as it always does)."""
    try:
        info = await client.info("server")
    except aioredis.RedisError:
        return
    if problem := too_old(str(info.get("redis_version", "0"))):
        raise RuntimeError(problem)


def redis_warnings(client: redis.Redis) -> tuple[dict[str, Any], list[str]]:
    """The settings found, and a warning for each one clawq cannot live with."""
    persistence = client.info("persistence")
    memory = client.info("memory")
    found: dict[str, Any] = {
        "version": str(client.info("server").get("redis_version", "0")),
        "aof_enabled": bool(int(persistence.get("aof_enabled", 0))),
        "maxmemory_policy": str(memory.get("maxmemory_policy", "")),
    }
    warnings = [problem] if (problem := too_old(found["version"])) else []
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
