"""Cancel and steer stop real work: running commands die within a second, every call gets a
result, and a steered job goes on with the new message. A failed exec stops its siblings."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.client import Job
from tests.integration.conftest import Cluster, call, start_cluster
from tests.processes import gone_within, token, wait_for_pids


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(workers_per_group=2)


def test_cancel_stops_a_running_command_within_a_second(cluster: Cluster, workspace: Path) -> None:
    mark = token()
    job = cluster.client.submit(
        "slow",
        workspace=str(workspace),
        allow=["exec"],
        script={
            "turns": [
                {"tool_calls": [call("s", "exec", command=f"exec sleep {mark}")]},
                {"tool_calls": [call("t", "exec", command="touch second_turn")]},
                {"text": "never"},
            ]
        },
    )
    wait_for_pids(mark, seconds=20)
    started = time.monotonic()
    job.cancel()
    assert gone_within(mark, 1.0) < 1.0
    result = job.wait(timeout=30)
    assert result.status == "cancelled" and time.monotonic() - started < 10
    (only,) = result.tool_calls
    assert only.is_error and "cancelled" in only.output
    assert not (workspace / "second_turn").exists()


def test_a_failed_exec_cancels_its_running_siblings(cluster: Cluster, workspace: Path) -> None:
    mark = token()
    calls = [  # all three only read, so they run as one parallel batch
        call("slow", "exec", command=f"sleep {mark}"),
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
    gone_within(mark, 2.0)  # the worker killed the running sibling


def test_steer_stops_the_turn_and_continues_with_the_message(
    cluster: Cluster, workspace: Path
) -> None:
    mark = token()
    job: Job = cluster.client.submit(
        "work",
        workspace=str(workspace),
        allow=["exec"],
        script={
            "turns": [
                {"tool_calls": [call("s", "exec", command=f"exec sleep {mark}")]},
                {"text": "steered: done"},
            ]
        },
    )
    wait_for_pids(mark, seconds=20)
    job.steer("stop sleeping and wrap up")
    gone_within(mark, 1.0)
    result = job.wait(timeout=30)
    assert result.status == "completed" and result.final_text == "steered: done"
    (only,) = result.tool_calls
    assert only.is_error and "steered" in only.output
    steered = [e.data for e in job.events() if e.type == "steered"]
    assert steered == [{"text": "stop sleeping and wrap up"}]
    # the model's next turn got the message: in the transcript after the stopped turn (its
    # call and result), before the final answer
    rows = cluster.client.store.transcript(job.id, 50)
    roles = [r["role"] for r in rows]
    said = [
        i for i, r in enumerate(rows) if "stop sleeping and wrap up" in json.dumps(r["content"])
    ]
    assert len(said) == 1 and rows[said[0]]["role"] == "user", rows
    assert roles.index("assistant") < said[0] < len(rows) - 1
    assert rows[-1]["role"] == "assistant" and "steered: done" in json.dumps(rows[-1]["content"])
