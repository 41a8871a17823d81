"""Subagent limits under load, with two orchestrator processes: a spawn storm never runs more
children than the cluster-wide limit, and a child whose orchestrator is SIGKILLed frees its
slot within the lease."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from broker import keys
from broker.protocol import FINAL_STATUSES
from broker.redis.presence import live_processes
from orchestrator.client.base import Job
from tests.integration.conftest import Cluster, call, script, start_cluster, wait_until

LIMIT = 8
LEASE_S = 2.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(
        workers_per_group=2,
        concurrency=6,  # 12 executors: more than the limit, so only the limit holds children
        groups=("runtime", "sessions"),
        orchestrators=2,
        exec_security="full",
        exec_ask="off",
        subagent_lease_s=LEASE_S,
        max_concurrent_subagents=LIMIT,
    )


class Sampler(threading.Thread):
    """Reads the live running count every few milliseconds."""

    def __init__(self, redis_url: str) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(redis_url)
        self.samples: list[int] = []
        self.done = threading.Event()

    def now(self) -> int:
        at = int(time.time() * 1000)
        return int(self.client.zcount(keys.SUBAGENTS_RUNNING, at, "+inf"))

    def run(self) -> None:
        while not self.done.is_set():
            self.samples.append(self.now())
            time.sleep(0.02)

    def stop(self) -> None:
        self.done.set()
        self.join()
        self.client.close()


def children_of(cluster: Cluster, parents: list[str]) -> list[dict[str, Any]]:
    return cluster.client.store.conn.execute(
        "SELECT id, status, parent_session FROM jobs WHERE parent_id = ANY(%s)", (parents,)
    ).fetchall()


def settle(cluster: Cluster, parents: list[str], timeout: float) -> list[dict[str, Any]]:
    def ended() -> list[dict[str, Any]]:
        rows = children_of(cluster, parents)
        return rows if rows and all(r["status"] in FINAL_STATUSES for r in rows) else []

    return wait_until(ended, timeout, "children ended")  # type: ignore[no-any-return]


def test_a_spawn_storm_stays_within_the_limits(cluster: Cluster, workspace: Path) -> None:
    sampler = Sampler(cluster.iso.redis_url)
    sampler.start()
    # each child records when its work really ran (a file of its own in the workspace)
    record = (
        'python3 -c \'import os, tempfile, time; fd, _ = tempfile.mkstemp(dir=".", '
        'prefix="run."); s = time.time(); time.sleep(0.5); '
        'os.write(fd, f"{s} {time.time()}".encode())\''
    )
    worker = script({"tool_calls": [call("w", "exec", command=record)]}, {"text": "child done"})
    jobs = [
        cluster.client.submit(
            f"parent {p}",
            workspace=str(workspace),
            script={
                "turns": [
                    {
                        "tool_calls": [
                            call(f"s{n}", "sessions_spawn", task=f"t{n}", label=f"c{n}")
                            for n in range(6)
                        ]
                    },
                    {"text": "spawned"},
                ],
                "subagents": {"*": worker},
                "on_announce": script({"text": "noted"}),
            },
        )
        for p in range(12)
    ]
    results = [job.wait(timeout=120) for job in jobs]
    rows = settle(cluster, [j.id for j in jobs], timeout=120)
    time.sleep(LEASE_S)
    sampler.stop()

    spawned = [c for r in results for c in r.tool_calls if not c.is_error]
    rejected = [c.output for r in results for c in r.tool_calls if c.is_error]
    # every admitted spawn made exactly one child (a call run twice, or one that failed
    # after its child started, is shown with how many times it ran)
    runs = [(c.id, c.attempts, c.is_error, c.output[:160]) for r in results for c in r.tool_calls]
    assert len(spawned) == len(rows), [
        run for run in runs if run[1] > 1 or (run[2] and not run[3].startswith("spawn rejected"))
    ]
    assert all(r["status"] == "completed" for r in rows), rows
    assert rejected and all(o.startswith("spawn rejected: ") for o in rejected)
    assert any("(concurrency: 8 of 8)" in o for o in rejected)
    per_parent = [sum(1 for c in r.tool_calls if not c.is_error) for r in results]
    assert max(per_parent) <= 5
    assert max(sampler.samples) <= LIMIT and max(sampler.samples) >= LIMIT // 2
    assert sampler.samples[-1] == 0
    with redis.Redis.from_url(cluster.iso.redis_url) as client:
        sizes = [client.scard(keys.subagent_children(j.id)) for j in jobs]
    assert sizes == per_parent  # finished children still count until archived
    # what really ran: never more children at once than the limit, though executors were free
    spans = [tuple(map(float, p.read_text().split())) for p in workspace.glob("run.*")]
    assert len(spans) == len(rows)
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running, most = 0, 0
    for _, step in edges:
        running += step
        most = max(most, running)
    assert LIMIT // 2 <= most <= LIMIT, most


def spawning_one(cluster: Cluster, workspace: Path, label: str, command: str, says: str) -> Job:
    """A parent job that spawns one child (call `s`), which runs `command` (call `w`) and
    ends saying `says`."""
    return cluster.client.submit(
        f"one child: {label}",
        workspace=str(workspace),
        script={
            "turns": [
                {"tool_calls": [call("s", "sessions_spawn", task=label, label=label)]},
                {"text": "spawned"},
            ],
            "subagents": {
                label: script({"tool_calls": [call("w", "exec", command=command)]}, {"text": says})
            },
            "on_announce": script({"text": "noted"}),
        },
    )


def test_a_sigkilled_childs_slot_is_freed(cluster: Cluster, workspace: Path) -> None:
    parent = spawning_one(cluster, workspace, "long", "sleep 6", "survived")
    parent.wait(timeout=60)
    child = parent.subagents()[0].id
    sampler = Sampler(cluster.iso.redis_url)
    deadline = time.monotonic() + 30
    while sampler.now() == 0 or cluster.client.store.job_status(child) != "running":
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    owner = cluster.client.store.conn.execute(
        "SELECT orchestrator FROM jobs WHERE id = %s", (child,)
    ).fetchone()["orchestrator"]  # type: ignore[index]
    pid = next(p["pid"] for p in live_processes(cluster.client.redis) if p["id"] == owner)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()

    while sampler.now() != 0:  # freed without anyone releasing it: the lease ran out
        assert time.monotonic() - killed_at < LEASE_S + 1.5, "the dead child's slot leaked"
        time.sleep(0.05)
    freed_after = time.monotonic() - killed_at
    assert freed_after <= LEASE_S + 1.5

    # the surviving orchestrator resumes the child, which takes a slot again and finishes
    final = cluster.client.job(child).wait(timeout=60)
    assert final.status == "completed" and final.final_text == "survived"
    assert sampler.now() == 0
    sampler.client.close()


def test_a_spawn_whose_worker_was_taken_for_dead_makes_one_child(
    cluster: Cluster, workspace: Path
) -> None:
    """A sessions worker stopped (SIGSTOP) mid-spawn, past its heartbeat's TTL: the watchdog
    sends the call again, a second worker runs it, then the first wakes and finishes its
    run too. One child is made, and its work runs once. Both runs are held at the child's
    insert (its session's row: the test holds a SHARE lock on `sessions`) until then."""
    once = 'python3 -c \'import tempfile; tempfile.mkstemp(dir=".", prefix="ran.")\''
    parent = spawning_one(cluster, workspace, "once", once, "ok")
    client = redis.Redis.from_url(cluster.iso.redis_url)
    holder = psycopg.connect(cluster.iso.database_url, autocommit=False)
    holder.execute("LOCK TABLE sessions IN SHARE MODE")  # no session is made until released
    stopped: list[int] = []
    try:

        def claimed_by(exclude: str = "") -> str | None:
            for key in client.scan_iter(match=keys.call(parent.id, "*", "s")):  # type: ignore[arg-type]
                owner = client.hget(key, "proc")
                if owner and owner.decode() != exclude:
                    return owner.decode()
            return None

        first = wait_until(claimed_by, 30, "the spawn claimed")
        pid = int(first.rsplit(":", 1)[1])
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)
        assert wait_until(lambda: claimed_by(exclude=first), 30, "the spawn sent again")
        holder.rollback()  # the second run goes on, and ends
        time.sleep(1.0)
        os.kill(pid, signal.SIGCONT)  # the first goes on too
        stopped.clear()
        assert parent.wait(timeout=60).status == "completed"
        settle(cluster, [parent.id], timeout=60)
        time.sleep(2.0)  # the first run's agent run, sent again, is refused meanwhile
        rows = settle(cluster, [parent.id], timeout=60)
        assert len(rows) == 1 and rows[0]["status"] == "completed", rows
        assert len(list(workspace.glob("ran.*"))) == 1  # the child's work ran once
        session = cluster.client.store.job(parent.id)["session_id"]  # type: ignore[index]
        assert client.scard(keys.subagent_children(session)) == 1  # admitted once
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        holder.rollback()
        holder.close()
        client.close()
