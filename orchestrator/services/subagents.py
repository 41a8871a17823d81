"""Finished subagents stop counting against their parent after the archive delay."""

from __future__ import annotations

from typing import Any

from broker import keys
from broker.config.settings import Settings
from broker.pg.store import AsyncStore
from orchestrator.services.service import Periodic


class SubagentArchive(Periodic):
    name = "subagent archive"

    def __init__(self, settings: Settings, store: AsyncStore, redis: Any) -> None:
        super().__init__()
        self.settings = settings
        self.store = store
        self.redis = redis
        self.interval_s = min(60.0, settings.subagent_archive_after_s / 4)

    async def tick(self) -> None:
        archived = await self.store.archive_finished_children(
            self.settings.subagent_archive_after_s
        )
        for child, parent_session in archived:
            await self.redis.srem(keys.subagent_children(parent_session), child)
