"""The thread that keeps an orchestrator's presence and its jobs' leases alive.

Beaten from the event loop, a refresh waits behind every ready callback: a storm of
thousands of accepts once delayed it past the lease TTL, and another orchestrator resumed
1,743 jobs that were still running here (each ran twice). A thread beats on time. It
stops beating when the loop has not checked in for `orchestrator_stall_s`, so a wedged
loop still loses its jobs to the others, as a dead process does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from broker import keys
from broker.settings import Settings

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
    """Refreshes `clawq:proc:<id>`, the leases of `jobs()` and the running slots of
    `children()` every heartbeat interval, while the event loop checks in."""

    def __init__(
        self,
        settings: Settings,
        proc_id: str,
        info: str,
        jobs: Callable[[], list[str]],
        children: Callable[[], list[str]],
    ) -> None:
        ttl = settings.heartbeat_ttl_s
        timeout = max(1.0, ttl / 4)  # a beat stuck behind a slow read must not outlive a TTL
        self.client = redis.Redis.from_url(
            settings.redis_url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self.settings = settings
        self.proc_id, self.info = proc_id, info
        self.jobs, self.children = jobs, children
        self.ttl_ms = int(ttl * 1000)
        self.seen = time.monotonic()  # the event loop's last check-in
        self.stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clawq-leases", daemon=True)

    def check_in(self) -> None:
        """Called on the event loop: it is alive."""
        self.seen = time.monotonic()

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self._thread.join(timeout=5)
        self.client.close()

    def beat(self) -> None:
        s = self.settings
        leases = [keys.lease(job_id) for job_id in self.jobs()]
        expiry = int((time.time() + s.subagent_lease_s) * 1000)
        children = dict.fromkeys(self.children(), expiry)
        pipe = self.client.pipeline(transaction=False)
        pipe.set(keys.proc(self.proc_id), self.info, px=self.ttl_ms)
        for start in range(0, len(leases), LEASE_BATCH):
            batch = leases[start : start + LEASE_BATCH]
            pipe.eval(REFRESH, len(batch), *batch, self.ttl_ms, self.proc_id)
        if children:  # the running slots of the subagents run here
            pipe.zadd(keys.SUBAGENTS_RUNNING, children, xx=True)
        pipe.execute()

    def _run(self) -> None:
        s = self.settings
        while not self.stopped.wait(s.heartbeat_interval_s):
            stalled = time.monotonic() - self.seen
            if stalled > s.orchestrator_stall_s:
                log.error("event loop silent for %.0f s: leases left to lapse", stalled)
                continue
            try:
                self.beat()
            except Exception as exc:  # never let the thread die: silence reads as death
                log.warning("lease refresh failed (%s); retrying", exc)
