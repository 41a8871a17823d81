"""An orchestrator killed with SIGKILL mid-job: another resumes the job from its
transcript, and the call that had already run is answered from the ledger, not re-run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from broker import keys
from broker.protocol import Event
from orchestrator.client.base import Job
from tests.integration.conftest import Cluster, start_cluster, wait_until


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(heartbeat_interval_s=0.5, heartbeat_ttl_s=2)


def signal_owner(client: redis.Redis, job: Job, sig: signal.Signals) -> bytes:
    """Send `sig` to the orchestrator holding the job's lease; that lease's value."""
    owner = client.get(keys.lease(job.id))
    assert owner is not None
    os.kill(int(owner.decode().rsplit(":", 1)[1]), sig)
    return owner


def test_job_resumes_on_another_orchestrator(cluster: Cluster, workspace: Path) -> None:
    env = {
        **os.environ,
        **cluster.iso.env(),
        "CLAWQ_HEARTBEAT_INTERVAL_S": "0.5",
        "CLAWQ_HEARTBEAT_TTL_S": "2",
    }
    second = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "orchestrator", "--log-level", "warning"],
        env=env,
    )
    client = redis.Redis.from_url(cluster.iso.redis_url)
    try:
        script = {
            "turns": [
                {
                    "tool_calls": [
                        {
                            "id": "s",
                            "name": "exec",
                            "input": {"command": "sleep 1; echo ran >> runs.txt"},
                        }
                    ]
                },
                {"tool_calls": [{"id": "t", "name": "list_files", "input": {}}]},
                {"text": "survived"},
            ]
        }
        job = cluster.client.submit("x", workspace=str(workspace), script=script, allow=["exec"])
        for event in job.events():
            if event.type == "tool_call_queued":
                break
        signal_owner(client, job, signal.SIGKILL)
        started = time.monotonic()
        result = job.wait(timeout=60)
        assert result.status == "completed" and result.final_text == "survived"
        assert time.monotonic() - started < 30
        assert (workspace / "runs.txt").read_text() == "ran\n"  # not run a second time
        assert [c.id for c in result.tool_calls] == ["s", "t"]
        # the lease goes right after job_finished is sent: wait for it, never for long
        wait_until(lambda: client.get(keys.lease(job.id)) is None, 5, "the lease released")
        starts = [e.data["resumed"] for e in job.events() if e.type == "job_started"]
        assert starts == [False, True]
    finally:
        client.close()
        second.terminate()
        second.wait(15)


HOLD = 4242  # an advisory lock: while the test holds it, a turn calling the tool is not stored

# the turn's write waits in a trigger until the test lets it go: as a slow commit would
HOLD_TRIGGER = """
CREATE OR REPLACE FUNCTION clawq_test_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.name = '{tool}' AND NEW.status = 'queued' THEN
    PERFORM pg_advisory_lock_shared({lock});
    PERFORM pg_advisory_unlock_shared({lock});
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER clawq_test_hold BEFORE INSERT ON tool_calls
  FOR EACH ROW EXECUTE FUNCTION clawq_test_hold();
"""
WAITING = "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND NOT granted"
LINE = {"path": "out.txt", "content": "a line\n", "append": True}
WRITE = {
    "turns": [
        {"tool_calls": [{"id": "w", "name": "write_file", "input": LINE}]},
        {"text": "written"},
    ]
}


@pytest.fixture
def held(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[psycopg.Connection[Any]]:
    """A connection holding back every turn that calls a tool (write_file, or the one
    the test gives) from being stored, till released."""
    tool = getattr(request, "param", "write_file")
    db = psycopg.connect(cluster.iso.database_url, autocommit=True)
    db.execute(HOLD_TRIGGER.format(tool=tool, lock=HOLD))
    db.execute("SELECT pg_advisory_lock(%s)", (HOLD,))
    try:
        yield db
    finally:
        db.execute("SELECT pg_advisory_unlock_all()")
        db.execute("DROP TRIGGER clawq_test_hold ON tool_calls")
        db.close()


@pytest.fixture
def orchestrators(cluster: Cluster) -> Iterator[Callable[[], None]]:
    """Starts orchestrators of the test's own (the test before may have killed the
    cluster's)."""
    env = {
        **os.environ,
        **cluster.iso.env(),
        "CLAWQ_HEARTBEAT_INTERVAL_S": "0.5",
        "CLAWQ_HEARTBEAT_TTL_S": "2",
    }
    started: list[subprocess.Popen[bytes]] = []
    command = [sys.executable, "-m", "orchestrator.cli", "orchestrator", "--log-level", "warning"]
    yield lambda: started.append(subprocess.Popen(command, env=env))
    for process in started:
        process.terminate()
        process.wait(15)


@pytest.fixture
def client(cluster: Cluster) -> Iterator[redis.Redis]:
    """The cluster's Redis; the turns' gates the test left are removed after it."""
    client = redis.Redis.from_url(cluster.iso.redis_url)
    yield client
    for gate in client.scan_iter(keys.turn_gate("*")):
        client.delete(gate)
    client.close()


def write_sent_while_stored(
    cluster: Cluster, client: redis.Redis, held: psycopg.Connection[Any], workspace: Path
) -> Job:
    """A job of one write, once its write is sent while its turn's write waits."""
    job = cluster.client.submit("x", workspace=str(workspace), script=WRITE)
    stream = keys.events(job.id)
    queued = b'"type":"tool_call_queued"'
    wait_until(lambda: any(queued in f[b"e"] for _, f in client.xrange(stream)), 20, "sent")
    wait_until(lambda: held.execute(WAITING, (HOLD,)).fetchone() is not None, 10, "held")
    return job


def killed_while_held(client: redis.Redis, held: psycopg.Connection[Any], job: Job) -> None:
    """The job's orchestrator killed while its held write waits, which never commits."""
    signal_owner(client, job, signal.SIGKILL)
    blocked = held.execute(WAITING, (HOLD,)).fetchone()
    assert blocked is not None
    held.execute("SELECT pg_terminate_backend(%s)", (blocked[0],))  # never committed
    held.execute("SELECT pg_advisory_unlock(%s)", (HOLD,))


def test_a_write_acts_only_once_its_turn_is_stored(
    cluster: Cluster,
    workspace: Path,
    held: psycopg.Connection[Any],
    orchestrators: Callable[[], None],
    client: redis.Redis,
) -> None:
    """A write is sent while its turn is being stored, and its worker takes it; the write
    is held in PostgreSQL and its orchestrator killed, so the turn is never stored: the
    file is not written. Another orchestrator resumes the job, the model is asked again,
    and the file is written once."""
    orchestrators()  # one to run it
    job = write_sent_while_stored(cluster, client, held, workspace)
    time.sleep(3)  # its worker took it, found the turn not stored, and let it go
    assert not (workspace / "out.txt").exists()
    assert client.exists(keys.call(job.id, 0, "w")) == 0  # never claimed
    orchestrators()  # one to resume it
    killed_while_held(client, held, job)
    result = job.wait(timeout=60)
    assert result.status == "completed" and result.final_text == "written"
    assert (workspace / "out.txt").read_text() == "a line\n"  # once
    # the resumed turn's gate was opened once it was stored; the dead one's never was
    gates = [client.lrange(k, 0, -1) for k in client.scan_iter(keys.turn_gate("*"))]
    assert gates == [[b"stored"]]
    starts = [e.data["resumed"] for e in job.events() if e.type == "job_started"]
    assert starts == [False, True]


def test_a_write_whose_turn_is_stored_late_acts_once(
    cluster: Cluster,
    workspace: Path,
    held: psycopg.Connection[Any],
    orchestrators: Callable[[], None],
    client: redis.Redis,
) -> None:
    """A turn stored seconds late (a slow commit): its worker gave the write up meanwhile,
    and it is sent again once the turn is stored, not before (a resend per look of the
    watchdog would use up its deliveries): it acts once, on its second delivery."""
    orchestrators()
    job = write_sent_while_stored(cluster, client, held, workspace)
    # given up after 2 s; the watchdog would have sent it again twice by 12 s
    time.sleep(14)
    assert not (workspace / "out.txt").exists()
    held.execute("SELECT pg_advisory_unlock(%s)", (HOLD,))
    result = job.wait(timeout=60)
    assert result.status == "completed" and result.final_text == "written"
    assert (workspace / "out.txt").read_text() == "a line\n"
    (call,) = result.tool_calls
    assert not call.is_error and call.attempts == 2, call


READ_THEN_WRITE = {
    "turns": [
        {"tool_calls": [{"id": "r", "name": "list_files", "input": {}}]},
        {"tool_calls": [{"id": "w", "name": "write_file", "input": LINE}]},
        {"text": "written"},
    ]
}


def read_turn_held(cluster: Cluster, held: psycopg.Connection[Any], workspace: Path) -> Job:
    """A job of a read turn, then a write, once the read turn's write is held."""
    job = cluster.client.submit("x", workspace=str(workspace), script=READ_THEN_WRITE)
    wait_until(lambda: held.execute(WAITING, (HOLD,)).fetchone() is not None, 20, "held")
    return job


def resumed_and_written_once(job: Job, workspace: Path) -> None:
    """The job, resumed once by another orchestrator, completed its two calls; the file
    was written once."""
    result = job.wait(timeout=60)
    assert result.status == "completed" and result.final_text == "written"
    assert (workspace / "out.txt").read_text() == "a line\n"  # once
    assert [c.id for c in result.tool_calls] == ["r", "w"]
    starts = [e.data["resumed"] for e in job.events() if e.type == "job_started"]
    assert starts == [False, True]


@pytest.mark.parametrize("held", ["list_files"], indirect=True)
def test_a_turn_that_only_reads_goes_on_while_stored_and_nothing_acts_before_it(
    cluster: Cluster,
    workspace: Path,
    held: psycopg.Connection[Any],
    orchestrators: Callable[[], None],
    client: redis.Redis,
) -> None:
    """A turn whose one call reads does not wait for its own write: its read runs, and the
    model is asked again while the turn is held in PostgreSQL. The next turn's write_file
    is sent, but does not act: its turn is stored after the one before, which never is.
    Its orchestrator is killed there; another resumes the job from the transcript it has
    (the read turn not in it): the model is asked again from there, and the file is
    written once."""
    orchestrators()  # one to run it
    job = read_turn_held(cluster, held, workspace)
    stream = keys.events(job.id)

    def queued(call_id: str) -> bool:
        events = [Event.model_validate_json(f[b"e"]) for _, f in client.xrange(stream)]
        return any(
            e.type == "tool_call_queued" and e.data.get("call_id") == call_id for e in events
        )

    wait_until(lambda: queued("w"), 10, "the next turn asked while the read turn is held")
    time.sleep(3)  # the write's worker took it, found its turn not stored, and let it go
    assert not (workspace / "out.txt").exists()
    assert client.exists(keys.call(job.id, 1, "w")) == 0  # never claimed
    orchestrators()  # one to resume it
    killed_while_held(client, held, job)
    resumed_and_written_once(job, workspace)


@pytest.mark.parametrize("held", ["list_files"], indirect=True)
def test_an_orchestrator_stopping_lets_its_write_land_before_it_lets_the_job_go(
    cluster: Cluster,
    workspace: Path,
    held: psycopg.Connection[Any],
    orchestrators: Callable[[], None],
    client: redis.Redis,
) -> None:
    """An orchestrator told to stop (SIGTERM) while a read turn's write is held in
    PostgreSQL keeps the job's lease until that write has landed: whoever resumes the
    job reads a transcript that no late commit changes after. Then it lets the job go,
    and another orchestrator completes it."""
    orchestrators()  # one to run it
    job = read_turn_held(cluster, held, workspace)
    owner = signal_owner(client, job, signal.SIGTERM)
    time.sleep(8)  # its consumer stopped (6 s at most), its jobs cancelled
    assert client.get(keys.lease(job.id)) == owner  # still its: the write has not landed
    orchestrators()  # one to resume it
    held.execute("SELECT pg_advisory_unlock(%s)", (HOLD,))
    wait_until(lambda: client.get(keys.lease(job.id)) != owner, 20, "the job let go")
    resumed_and_written_once(job, workspace)
