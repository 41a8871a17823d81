"""An orchestrator's view of the live configuration: before each job it reads the
`config` change counter (one Redis GET); when that moved, it loads the applied version
from PostgreSQL and swaps the policy, hooks, limits and settings its next jobs use. A
version that fails to load here, or fails this process's health check with it (a hook
program missing on this host), is marked bad and rolled back to the last good one, so a
broken configuration never sticks."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row

from broker import keys
from broker.config.live import TOPIC, effective, reject
from broker.config.settings import Settings
from broker.redis.ratelimit import RateLimiter
from workers.confine.host import contains

if TYPE_CHECKING:
    from orchestrator.job.state import Services

log = logging.getLogger(__name__)


class LiveSettings:
    def __init__(self, base: Settings) -> None:
        self.base = base
        self.seen = -1  # the change counter last applied
        self.version = 0  # the config version in force (0: the environment alone)
        self.lock = asyncio.Lock()

    async def refresh(self, s: Services) -> None:
        raw = await s.redis.get(keys.version(TOPIC))
        counter = int(raw) if raw else 0
        if counter == self.seen:
            return
        async with self.lock:
            if counter == self.seen:
                return
            version, config = await self._applied(s)
            try:
                self._install(s, effective(self.base, config))
            except Exception as exc:
                log.error("live configuration %s does not load (%s); rolling back", version, exc)
                await asyncio.to_thread(reject, self.base, version, str(exc))
                return  # the rollback bumps the counter: the next job loads the good one
            self.seen, self.version = counter, version
            log.info("live configuration version %s in force", version or "(environment)")

    async def _applied(self, s: Services) -> tuple[int, dict[str, Any]]:
        async with s.store.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                "SELECT version, config FROM config_versions WHERE status = 'applied'"
                " ORDER BY version DESC LIMIT 1"
            )
            row = await cur.fetchone()
        return (int(row["version"]), row["config"]) if row else (0, {})

    def _install(self, s: Services, settings: Settings) -> None:
        from orchestrator.calls.hooks import Hooks
        from orchestrator.calls.policy import PolicyEngine

        policy = PolicyEngine(s.registry, settings.tool_policy)
        hooks = Hooks(settings.hooks, settings=settings)
        problems = hooks.problems()
        if problems:
            raise ValueError("; ".join(problems))
        s.settings, s.policy, s.hooks = settings, policy, hooks
        s.contained = contains(settings)
        s.limiter = RateLimiter(s.redis, settings.rate_limit_per_hour)
