"""Artifacts past their retention go, and the bytes no artifact uses any more."""

from __future__ import annotations

import asyncio
import logging

from broker.config.settings import Settings
from broker.pg.store import Store
from broker.stores.artifacts import ArtifactStore
from orchestrator.services.service import Periodic

log = logging.getLogger("clawq.orchestrator")


class ArtifactPurge(Periodic):
    name = "artifact purge"
    interval_s = 600.0  # retention is days; ten minutes late is nothing

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings

    def purge(self) -> int:
        store = Store(self.settings.database_url)
        try:
            return ArtifactStore(store.conn, self.settings).purge()
        finally:
            store.close()

    async def tick(self) -> None:
        if gone := await asyncio.to_thread(self.purge):
            log.info("purged %d expired artifacts", gone)
