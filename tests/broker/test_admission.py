"""Subagent admission in Redis: every limit, leases that free a dead child's slot, and a
spawn storm from two processes that never exceeds the limits."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
import redis

from broker import keys
from broker.redis.admission import Limits, SubagentSlots
from tests.conftest import Isolated


@pytest.fixture
def client(isolated: Isolated) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(isolated.redis_url) as conn:
        yield conn


def test_each_limit_and_its_message(client: redis.Redis) -> None:
    slots = SubagentSlots(client, Limits(max_depth=1, max_concurrent=3, max_children=2))
    assert slots.admit("deep", "p", depth=2).message() == (
        "spawn rejected: subagents may not spawn deeper (depth: 2 of 1)"
    )
    assert slots.admit("a", "p", 1).admitted and slots.admit("b", "p", 1).admitted
    children = slots.admit("c", "p", 1)
    assert (children.admitted, children.limit, children.current) == (False, "children", 2)
    assert slots.admit("b", "p", 1).admitted  # b again (its call ran again): not a third
    assert slots.admit("d", "q", 1).admitted
    busy = slots.admit("e", "r", 1)
    assert (busy.limit, busy.current, busy.maximum) == ("concurrency", 3, 3)
    again = slots.admit("d", "q", 1)  # d again, at the cluster's limit: its own slot
    assert (again.admitted, again.current) == (True, 3)
    slots.release("a")
    assert slots.admit("e", "r", 1).admitted  # a running slot came back...
    slots.release("b")
    assert slots.admit("f", "p", 1).limit == "children"  # ...but a and b still count for p
    slots.archive("p", "a")
    assert slots.admit("f", "p", 1).admitted


def test_a_child_that_stops_renewing_frees_its_slot(client: redis.Redis) -> None:
    slots = SubagentSlots(client, Limits(max_concurrent=1, lease_s=10))
    assert slots.admit("alive", "p", 1, now=1000).admitted
    assert not slots.admit("other", "q", 1, now=1005).admitted
    slots.renew(["alive"], now=1008)  # its orchestrator renews: still held at 1012
    assert not slots.admit("other", "q", 1, now=1012).admitted
    assert slots.admit("other", "q", 1, now=1019).admitted  # no renewal since 1008: freed
    assert slots.running(now=1019) == 1


STORM = """
import random, sys
import redis
from broker.redis.admission import Limits, SubagentSlots
slots = SubagentSlots(redis.Redis.from_url(sys.argv[1]), Limits(max_concurrent=8, max_children=5))
name = sys.argv[2]
admitted = []
for i in range(300):
    child = f"{name}-{i}"
    if slots.admit(child, f"parent-{i % 20}", 1).admitted:
        admitted.append(child)
    if admitted and random.random() < 0.6:
        slots.release(admitted.pop(random.randrange(len(admitted))))
for child in admitted:
    slots.release(child)
"""


def test_spawn_storm_from_two_processes_stays_within_limits(
    client: redis.Redis, isolated: Isolated
) -> None:
    highest = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal highest
        with redis.Redis.from_url(isolated.redis_url) as watcher:
            while not stop.is_set():
                highest = max(highest, int(watcher.zcard(keys.SUBAGENTS_RUNNING)))
                for parent in range(20):
                    assert watcher.scard(keys.subagent_children(f"parent-{parent}")) <= 5

    sampler = threading.Thread(target=sample)
    sampler.start()
    procs = [
        subprocess.Popen([sys.executable, "-c", STORM, isolated.redis_url, name])
        for name in ("orch-a", "orch-b")
    ]
    assert [p.wait(60) for p in procs] == [0, 0]
    stop.set()
    sampler.join()
    assert 1 <= highest <= 8
    assert client.zcard(keys.SUBAGENTS_RUNNING) == 0  # every slot released at the end
