"""Prometheus metrics scraped from a real running stack: after a scripted job with three
calls the workers' calls counter rose by three and their duration histogram has samples
(summed over the prefork processes' files), the orchestrator counted the job and its turns,
and the queue depths read 0 at rest. The Grafana dashboard uses only metrics that exist."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import Cluster, script, start_cluster, wait_until

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def ports() -> tuple[int, int]:
    return free_port(), free_port()


@pytest.fixture(scope="module")
def cluster(ports: tuple[int, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    orchestrator, workers = ports
    yield from start_cluster(
        groups=("fs",),
        metrics_port=orchestrator,
        worker_metrics_port=workers,
        metrics_dir=str(tmp_path_factory.mktemp("metrics")),
    )


def scrape(port: int) -> dict[str, float]:
    """`name{labels}` → value, from the text format."""
    body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    out: dict[str, float] = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def total(samples: dict[str, float], name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        v
        for k, v in samples.items()
        if (k == name or k.startswith(name + "{")) and all(w in k for w in want)
    )


def test_counters_move_histograms_fill_and_queues_rest_at_zero(
    cluster: Cluster, ports: tuple[int, int], workspace: Path
) -> None:
    orchestrator, workers = ports
    wait_until(lambda: _up(orchestrator) and _up(workers), 30, "the metrics endpoints")
    before_w, before_o = scrape(workers), scrape(orchestrator)
    (workspace / "a.txt").write_text("alpha\n")
    job = cluster.client.submit(
        "three calls",
        workspace=str(workspace),
        script=script(
            {"tool_calls": [{"id": "1", "name": "read_file", "input": {"path": "a.txt"}}]},
            {"tool_calls": [{"id": "2", "name": "list_files", "input": {"path": "."}}]},
            {"tool_calls": [{"id": "3", "name": "read_file", "input": {"path": "missing"}}]},
            {"text": "done"},
        ),
    )
    assert job.wait(timeout=60).status == "completed"

    after_w = scrape(workers)
    calls = total(after_w, "clawq_calls_total") - total(before_w, "clawq_calls_total")
    assert calls == 3
    errors = total(after_w, "clawq_calls_total", outcome="error") - total(
        before_w, "clawq_calls_total", outcome="error"
    )
    assert errors == 1  # the missing file
    assert total(after_w, "clawq_call_seconds_count", tool="read_file") >= 2
    assert total(after_w, "clawq_queue_wait_seconds_count", queue="fs") >= 3

    wait_until(
        lambda: (
            total(scrape(orchestrator), "clawq_jobs_total", status="completed")
            > total(before_o, "clawq_jobs_total", status="completed")
        ),
        10,
        "the job counted",
    )
    after_o = scrape(orchestrator)
    assert total(after_o, "clawq_turns_total") - total(before_o, "clawq_turns_total") == 4
    assert total(after_o, "clawq_turn_seconds_count") >= 4
    depths = {k: v for k, v in after_o.items() if k.startswith("clawq_queue_depth{")}
    assert depths and all(v == 0 for v in depths.values()), depths
    assert 'clawq_queue_depth{queue="fs"}' in depths


def _up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_dashboard_uses_only_metrics_that_exist() -> None:
    from prometheus_client import REGISTRY

    from broker.obs.metrics import metrics

    metrics()
    defined = {
        sample_name
        for family in REGISTRY.collect()
        for sample_name in [
            family.name,
            family.name + "_total",
            family.name + "_bucket",
            family.name + "_count",
            family.name + "_sum",
        ]
    } | {"clawq_queue_depth", "clawq_subagent_slots_in_use"}
    dashboard = json.loads((ROOT / "deploy/grafana/clawq.json").read_text())
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bclawq_[a-z_]+", target["expr"])
    }
    assert used and used <= defined, used - defined
