"""The concurrency scheduler with real workers: safe calls overlap on different worker
processes, unsafe calls overlap nothing, results come back in model order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.protocol import ToolCallRecord
from tests.integration.conftest import Cluster, call, start_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(workers_per_group=2)  # 2 runtime workers, 2 executors each


def overlap(a: ToolCallRecord, b: ToolCallRecord) -> bool:
    return a.started_at < b.finished_at and b.started_at < a.finished_at


def test_safe_calls_overlap_unsafe_calls_run_alone(cluster: Cluster, workspace: Path) -> None:
    calls = [
        call("r1", "exec", command="sleep 0.6; echo r1"),
        call("r2", "exec", command="sleep 0.6; echo r2"),
        call("r3", "exec", command="sleep 0.6; echo r3"),
        call("w1", "exec", command="sleep 0.3; echo w1 > w1.txt"),  # writes: alone
        call("r4", "exec", command="sleep 0.3; cat w1.txt"),
        call("r5", "exec", command="sleep 0.3; echo r5"),
    ]
    job = cluster.client.submit(
        "schedule",
        workspace=str(workspace),
        allow=["exec"],
        script={"turns": [{"tool_calls": calls}, {"text": "done"}]},
    )
    result = job.wait(timeout=60)
    by_id = {c.id: c for c in result.tool_calls}
    assert [c.id for c in result.tool_calls] == ["r1", "r2", "r3", "w1", "r4", "r5"]
    assert all(not c.is_error for c in result.tool_calls), result.tool_calls
    assert [by_id[i].output.splitlines()[0] for i in ("r1", "r2", "r3", "r5")] == [
        "r1",
        "r2",
        "r3",
        "r5",
    ]
    assert by_id["r4"].output.startswith("w1")  # ran after the write, which ran alone
    r1, r2, r3, w1, r4, r5 = (by_id[i] for i in ("r1", "r2", "r3", "w1", "r4", "r5"))
    assert overlap(r1, r2) and overlap(r2, r3) and overlap(r1, r3)
    assert len({r1.worker, r2.worker, r3.worker}) == 3  # three different processes
    assert overlap(r4, r5)
    for other in (r1, r2, r3, r4, r5):
        assert not overlap(w1, other)
    assert w1.started_at >= max(r1.finished_at, r2.finished_at, r3.finished_at)
    assert min(r4.started_at, r5.started_at) >= w1.finished_at
