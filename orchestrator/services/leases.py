"""An orchestrator's heartbeat also keeps its jobs' leases alive, from its thread.

Beaten from the event loop, a refresh waits behind every ready callback: a storm of
thousands of accepts once delayed it past the lease TTL, and another orchestrator resumed
1,743 jobs that were still running here (each ran twice). The heartbeat thread
(broker/redis/presence.py) beats on time. It stops beating when the loop has not checked in for
`orchestrator_stall_s`, so a wedged loop still loses its jobs to the others, as a dead
process does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.client import Pipeline

from broker import keys
from broker.config.settings import Settings
from broker.redis.presence import Heartbeat
from orchestrator.services.service import Service

log = logging.getLogger("clawq.orchestrator")

LEASE_BATCH = 1000  # leases refreshed by one command
# KEYS: job leases; ARGV: their TTL, this orchestrator. Thousands of leases in one command
# each second. A lease that lapsed while the loop was slow is taken again; one another
# orchestrator holds now is left to it.
REFRESH = """
local n = 0
for _, key in ipairs(KEYS) do
  local owner = redis.call('GET', key)
  if owner == ARGV[2] then
    redis.call('PEXPIRE', key, ARGV[1]); n = n + 1
  elseif not owner then
    redis.call('SET', key, ARGV[2], 'PX', ARGV[1]); n = n + 1
  end
end
return n
"""


class LeaseKeeper:
    """The heartbeat of `proc_id`, refreshing with it the leases of `jobs()` and the
    running slots of `children()`, while the event loop checks in."""

    def __init__(
        self,
        settings: Settings,
        proc_id: str,
        info: dict[str, Any],
        jobs: Callable[[], list[str]],
        children: Callable[[], list[str]],
    ) -> None:
        self.settings = settings
        self.proc_id = proc_id
        self.jobs, self.children = jobs, children
        self.seen = time.monotonic()  # the event loop's last check-in
        self.heartbeat = Heartbeat(
            redis.Redis.from_url(settings.redis_url),  # its settings; the beat has its own pool
            proc_id,
            info,
            settings.heartbeat_interval_s,
            settings.heartbeat_ttl_s,
            node=settings.node(),
            extra=self.refresh,
            alive=self.loop_alive,
        )
        self.start, self.stop = self.heartbeat.start, self.heartbeat.stop

    def check_in(self) -> None:
        """Called on the event loop: it is alive."""
        self.seen = time.monotonic()

    def loop_alive(self) -> bool:
        stalled = time.monotonic() - self.seen
        if stalled > self.settings.orchestrator_stall_s:
            log.error("event loop silent for %.0f s: leases left to lapse", stalled)
            return False
        return True

    def refresh(self, pipe: Pipeline) -> None:
        leases = [keys.lease(job_id) for job_id in self.jobs()]
        ttl_ms = self.heartbeat.ttl_ms
        for start in range(0, len(leases), LEASE_BATCH):
            batch = leases[start : start + LEASE_BATCH]
            pipe.eval(REFRESH, len(batch), *batch, ttl_ms, self.proc_id)
        expiry = int((time.time() + self.settings.subagent_lease_s) * 1000)
        if children := dict.fromkeys(self.children(), expiry):  # their running slots
            pipe.zadd(keys.SUBAGENTS_RUNNING, children, xx=True)


class Leases(Service):
    """The lease keeper as the orchestrator's duty: its thread beats, and the event loop
    checks in every heartbeat interval to say it is alive."""

    name = "leases"

    def __init__(self, keeper: LeaseKeeper, interval_s: float) -> None:
        super().__init__()
        self.keeper = keeper
        self.interval_s = interval_s

    async def start(self) -> None:
        await asyncio.to_thread(self.keeper.start)
        await super().start()

    async def run(self) -> None:
        while True:
            self.keeper.check_in()
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        await super().stop()
        await asyncio.to_thread(self.keeper.stop)  # and its presence goes
