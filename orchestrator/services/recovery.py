"""Recovery: resume running jobs whose orchestrator stopped holding their lease, and queue
again the agent runs a dead orchestrator had taken but not accepted; not while Redis has
just come back (a missing presence then says nothing).

The sweep reads PostgreSQL, so it runs every SWEEP_S; an orchestrator whose presence has
just gone (looked at every second, in Redis alone) brings it forward: its jobs are resumed
within a second of its leases lapsing."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from broker import keys, outage
from broker.config.settings import Settings
from broker.pg.store import AsyncStore
from broker.redis.agent_queue import AgentQueue
from orchestrator.services.service import Periodic

log = logging.getLogger("clawq.orchestrator")


SWEEP_S = 5.0


class Recovery(Periodic):
    name = "recovery sweep"
    interval_s = 1.0  # how often the presence of the other orchestrators is looked at

    def __init__(
        self,
        settings: Settings,
        store: AsyncStore,
        redis: Any,
        agent_queue: AgentQueue,
        own_id: str,
        running: Callable[[], Collection[str]],
        accept: Callable[[str], Awaitable[bool]],
    ) -> None:
        super().__init__()
        self.settings = settings
        self.store = store
        self.redis = redis
        self.agent_queue = agent_queue
        self.own_id = own_id
        self.running = running
        self.accept = accept
        self.last = 0.0
        self.gone_before: set[str] = set()

    async def tick(self) -> None:
        s = self.settings
        if not await outage.heartbeats_trusted(
            self.redis, s.heartbeat_interval_s, s.heartbeat_ttl_s
        ):  # Redis has just come back: every presence lapsed, and is beating again
            return
        gone = await self.gone_orchestrators()
        now = time.monotonic()
        due = now - self.last >= SWEEP_S or bool(gone - self.gone_before)
        self.gone_before = gone
        if not due:
            return
        self.last = now
        await self.agent_queue.restore_dead()
        for job_id in await self.orphans():
            if await self.accept(job_id):
                log.warning("resumed job %s: no live orchestrator held it", job_id)

    async def gone_orchestrators(self) -> set[str]:
        """Orchestrators known to take agent runs whose presence is gone."""
        takers = sorted(
            t.decode() if isinstance(t, bytes) else str(t)
            for t in await self.redis.smembers(keys.AGENTS_TAKERS)
        )
        async with self.redis.pipeline(transaction=False) as pipe:
            for taker in takers:
                pipe.exists(keys.proc(taker))
            alive = await pipe.execute()
        return {t for t, live in zip(takers, alive, strict=True) if not live}

    async def orphans(self) -> list[str]:
        """Unfinished jobs that nobody holds: no lease, and started by no live orchestrator
        but this one (a live one's lease may lapse while its loop is slow to take a reply;
        it sweeps its own jobs, and a dead one's presence is gone). Looked at again in
        the database at the end: most of a long list finish while it is checked."""
        running = self.running()
        candidates = [
            (job, owner)
            for job, owner in await self.store.orphan_candidates()
            if job not in running
        ]
        if not candidates:
            return []
        others = sorted({owner for _, owner in candidates if owner and owner != self.own_id})
        async with self.redis.pipeline(transaction=False) as pipe:
            for job, _ in candidates:
                pipe.exists(keys.lease(job))
            for owner in others:
                pipe.exists(keys.proc(owner))
            found = await pipe.execute()
        leased = found[: len(candidates)]
        alive = {
            owner for owner, live in zip(others, found[len(candidates) :], strict=True) if live
        }
        unheld = [
            job
            for (job, owner), held in zip(candidates, leased, strict=True)
            if not held and owner not in alive
        ]
        if not unheld:
            return []
        return [job for job, _ in await self.store.orphan_candidates(unheld)]
