"""A worker killed with SIGKILL mid-call loses nothing: the call is run again by a live
worker of its group, or, past the delivery cap, returned to the model as an error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from orchestrator.client import Job
from tests.integration.conftest import Cluster, start_cluster, wait_until


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # the default TTL: with 2 s, a loaded machine once let a live worker's heartbeat lapse,
    # its call was sent again as the failure detector must, and both runs wrote
    yield from start_cluster(
        workers_per_group=2, heartbeat_interval_s=0.5, heartbeat_ttl_s=4, max_deliveries=2
    )


def running_pid(
    cluster: Cluster, job: Job, timeout: float = 20, exclude: frozenset[int] = frozenset()
) -> int:
    """The pid of the process executing the job's only call, once it has started (and
    is not one of `exclude`)."""
    client = redis.Redis.from_url(cluster.iso.redis_url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for key in client.scan_iter(match=f"clawq:call:{job.id}:*"):
                status, proc = client.hmget(key, ["status", "proc"])
                pid = int(proc.decode().rsplit(":", 1)[1]) if proc else 0
                if status == b"running" and pid and pid not in exclude:
                    return pid
            time.sleep(0.05)
    finally:
        client.close()
    raise TimeoutError("the call never started")


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def exec_job(cluster: Cluster, workspace: Path, command: str) -> Job:
    script = {
        "turns": [
            {"tool_calls": [{"id": "x", "name": "exec", "input": {"command": command}}]},
            {"text": "done"},
        ]
    }
    return cluster.client.submit("run", workspace=str(workspace), script=script, allow=["exec"])


def test_killed_executor_process_is_redelivered(cluster: Cluster, workspace: Path) -> None:
    # long enough that a starved test process still kills it before the command ends (a
    # loaded CI machine once took 4 s from seeing it run to the kill)
    job = exec_job(cluster, workspace, "sleep 8; echo finished >> runs.txt; echo finished")
    pid = running_pid(cluster, job)
    with redis.Redis.from_url(cluster.iso.redis_url) as client:
        # who holds the call is the ledger's to say: a tool queue keeps no kombu `unacked`
        # entry (one round trip before and after every call), yet the call comes back
        assert client.hlen("unacked") == 0
    os.kill(pid, signal.SIGKILL)
    result = job.wait(timeout=60)
    assert result.status == "completed"
    (only,) = result.tool_calls
    assert not only.is_error and only.output.split("\n", 1)[1].startswith("finished")
    assert only.attempts == 2
    # the killed run never wrote, but it had begun: the model is told it may have
    assert only.output.startswith("[ran again after its worker died; its first run may")
    assert (workspace / "runs.txt").read_text() == "finished\n"


def runs(workspace: Path) -> int:
    path = workspace / "runs.txt"
    return path.read_text().count("run") if path.exists() else 0


def test_poison_call_stops_at_the_delivery_cap(cluster: Cluster, workspace: Path) -> None:
    """...and lands in the dead letters with its envelope; once the poison is gone,
    `clawq dlq retry` runs it again and its outcome reaches the ledger."""
    # the call's worker process dies every time it runs it (a command cannot kill its
    # worker from inside the confinement, so the test does it, as a crash would)
    job = exec_job(cluster, workspace, "echo run >> runs.txt; [ -e cured ] || sleep 30")
    killed: set[int] = set()
    for _ in range(2):
        pid = running_pid(cluster, job, exclude=frozenset(killed))
        wait_until(lambda: runs(workspace) > len(killed), what="the command running again")
        os.kill(pid, signal.SIGKILL)
        killed.add(pid)
    result = job.wait(timeout=90)
    assert result.status == "completed"
    (only,) = result.tool_calls
    assert only.is_error and "died 2 times" in only.output
    assert (workspace / "runs.txt").read_text() == "run\nrun\n"

    env = {**os.environ, **cluster.env}
    listed = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "dlq", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    (dead,) = [d for d in json.loads(listed.stdout) if d["job_id"] == job.id]
    assert dead["kind"] == "exhausted" and dead["attempts"] == 2 and dead["queue"] == "runtime"
    assert dead["envelope"]["input"]["command"].startswith("echo run")

    (workspace / "cured").touch()  # the poison is removed
    subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "dlq", "retry", str(dead["id"])],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    client = redis.Redis.from_url(cluster.iso.redis_url)
    try:
        key = f"clawq:call:{job.id}:{dead['turn']}:{dead['call_id']}"
        wait_until(lambda: client.hget(key, "status") == b"done", 30, "the retried call done")
        outcome = json.loads(client.hget(key, "outcome") or b"{}")
        assert not outcome["is_error"] and outcome["attempts"] == 1
    finally:
        client.close()
    assert (workspace / "runs.txt").read_text() == "run\nrun\nrun\n"
    shown = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "dlq", "show", str(dead["id"])],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(shown.stdout)["status"] == "retried"
    again = subprocess.run(  # it has an outcome now: never run a second time
        [sys.executable, "-m", "orchestrator.cli", "dlq", "retry", str(dead["id"])],
        env=env,
        capture_output=True,
        text=True,
    )
    assert again.returncode != 0 and "not sent again: the ledger has its outcome" in again.stderr
    assert (workspace / "runs.txt").read_text() == "run\nrun\nrun\n"


def test_whole_worker_killed_call_finishes_on_another_worker(
    cluster: Cluster, workspace: Path
) -> None:
    job = exec_job(cluster, workspace, "sleep 1.5; echo finished")
    child = running_pid(cluster, job)
    main = parent_of(child)
    os.kill(main, signal.SIGKILL)
    os.kill(child, signal.SIGKILL)
    result = job.wait(timeout=60)
    assert result.status == "completed"
    (only,) = result.tool_calls
    assert not only.is_error and "\nfinished\n" in only.output
    assert "ran again after its worker died" in only.output
    assert int(only.worker.rsplit(":", 1)[1]) != child


def test_a_message_that_is_not_an_envelope_goes_to_the_dead_letters(cluster: Cluster) -> None:
    from broker.celery.app import create_app
    from broker.pg.store import Store
    from broker.stores.dead_letters import DeadLetters

    app = create_app(cluster.iso.settings)
    app.send_task("clawq.tool.read_file", kwargs={"envelope": {"tool": 7}}, queue="fs")
    store = Store(cluster.iso.database_url)
    try:
        letters = DeadLetters(store.conn)
        wait_until(
            lambda: any(d.kind == "undecodable" for d in letters.list()), 30, "a dead letter"
        )
        (dead,) = [d for d in letters.list() if d.kind == "undecodable"]
        assert dead.task == "clawq.tool.read_file" and dead.queue == "fs"
        assert "not an envelope" in dead.reason and '"tool": 7' in dead.raw
    finally:
        store.close()
