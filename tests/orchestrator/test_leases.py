"""The lease keeper on a real Redis: leases live as long as the event loop checks in,
however busy the loop is between check-ins (one that lapsed meanwhile is taken again, one
another orchestrator took is left to it), and lapse once the loop falls silent."""

from __future__ import annotations

import time

import redis

from broker import keys
from orchestrator.services.leases import LeaseKeeper
from tests.conftest import Isolated


def keeper(isolated: Isolated, jobs: list[str]) -> LeaseKeeper:
    settings = isolated.settings.model_copy(
        update={"heartbeat_interval_s": 0.1, "heartbeat_ttl_s": 0.5, "orchestrator_stall_s": 1.0}
    )
    return LeaseKeeper(settings, "orch-1", {}, lambda: list(jobs), lambda: [])


def test_leases_outlive_their_ttl_while_the_loop_checks_in(isolated: Isolated) -> None:
    jobs = [f"job-{n}" for n in range(2500)]  # more than one refresh command's batch
    held = keeper(isolated, [*jobs, "taken", "lapsed"])
    with redis.Redis.from_url(isolated.redis_url) as client:
        for job in jobs:
            client.set(keys.lease(job), "orch-1", px=500)
        client.set(keys.lease("taken"), "orch-2", px=5000)  # resumed elsewhere meanwhile
        held.start()
        try:
            deadline = time.monotonic() + 2.0  # four TTLs
            while time.monotonic() < deadline:
                held.check_in()  # between check-ins the "loop" may be as busy as it likes
                time.sleep(0.3)
            assert all(client.exists(keys.lease(job)) for job in jobs)
            assert client.exists(keys.proc("orch-1"))
            # another's lease is left as it is (a refresh would have set it to 500 ms)
            assert client.get(keys.lease("taken")) == b"orch-2"
            assert client.pttl(keys.lease("taken")) > 1000
            assert client.get(keys.lease("lapsed")) == b"orch-1"  # one that lapsed: taken again
        finally:
            held.stop()


def test_a_silent_loop_lets_its_leases_lapse(isolated: Isolated) -> None:
    held = keeper(isolated, ["job"])
    with redis.Redis.from_url(isolated.redis_url) as client:
        client.set(keys.lease("job"), "orch-1", px=500)
        held.start()
        try:
            time.sleep(0.5)
            assert client.exists(keys.lease("job"))  # refreshed: the loop was seen at start
            time.sleep(1.5)  # past the stall limit and then the TTL, no check-in
            assert not client.exists(keys.lease("job"))
            assert not client.exists(keys.proc("orch-1"))
        finally:
            held.stop()
