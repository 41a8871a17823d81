"""Cancel and steer stop real work: running commands die within a second, every call gets a
result, and a steered job goes on with the new message. A failed exec stops its siblings."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.client import Job
from tests.integration.conftest import Cluster, call, start_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(workers_per_group=2)


def wait_file(path: Path, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.02)
    raise TimeoutError(path)


def sleepers(duration: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmdline[:2] == [b"sleep", duration.encode()]:
                found.append(int(entry))
    return found


def gone_within(pid: int, seconds: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return time.monotonic() - started
        time.sleep(0.01)
    raise AssertionError(f"process {pid} still alive after {seconds}s")


def test_cancel_stops_a_running_command_within_a_second(cluster: Cluster, workspace: Path) -> None:
    job = cluster.client.submit(
        "slow",
        workspace=str(workspace),
        allow=["exec"],
        script={
            "turns": [
                {"tool_calls": [call("s", "exec", command="echo $$ > pid; exec sleep 30")]},
                {"tool_calls": [call("t", "exec", command="touch second_turn")]},
                {"text": "never"},
            ]
        },
    )
    pid = int(wait_file(workspace / "pid"))
    started = time.monotonic()
    job.cancel()
    assert gone_within(pid, 1.0) < 1.0
    result = job.wait(timeout=30)
    assert result.status == "cancelled" and time.monotonic() - started < 10
    (only,) = result.tool_calls
    assert only.is_error and "cancelled" in only.output
    assert not (workspace / "second_turn").exists()


def test_a_failed_exec_cancels_its_running_siblings(cluster: Cluster, workspace: Path) -> None:
    calls = [  # all three only read, so they run as one parallel batch
        call("slow", "exec", command="sleep 31.7"),
        call("bad", "exec", command="sleep 0.5; ls /no/such/dir"),
        {"id": "read", "name": "list_files", "input": {}},
    ]
    job = cluster.client.submit(
        "cascade",
        workspace=str(workspace),
        allow=["exec"],
        script={"turns": [{"tool_calls": calls}, {"text": "done"}]},
    )
    result = job.wait(timeout=30)
    by_id = {c.id: c for c in result.tool_calls}
    assert result.status == "completed"
    assert by_id["bad"].is_error and "No such file" in by_id["bad"].output
    slow = by_id["slow"]
    assert (
        slow.is_error and "cancelled because exec(sleep 0.5; ls /no/such/dir) failed" in slow.output
    )
    assert not by_id["read"].is_error  # finished before the failure: not cancelled
    deadline = time.monotonic() + 2
    while sleepers("31.7") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sleepers("31.7")  # the worker killed the running sibling


def test_steer_stops_the_turn_and_continues_with_the_message(
    cluster: Cluster, workspace: Path
) -> None:
    job: Job = cluster.client.submit(
        "work",
        workspace=str(workspace),
        allow=["exec"],
        script={
            "turns": [
                {"tool_calls": [call("s", "exec", command="echo $$ > pid; exec sleep 30")]},
                {"text": "steered: done"},
            ]
        },
    )
    pid = int(wait_file(workspace / "pid"))
    job.steer("stop sleeping and wrap up")
    gone_within(pid, 1.0)
    result = job.wait(timeout=30)
    assert result.status == "completed" and result.final_text == "steered: done"
    (only,) = result.tool_calls
    assert only.is_error and "steered" in only.output
    steered = [e.data for e in job.events() if e.type == "steered"]
    assert steered == [{"text": "stop sleeping and wrap up"}]
