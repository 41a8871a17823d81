"""Loop detection through the whole stack: a scripted model that makes the same call (tool
and input) again and again is warned at N in a row and stopped at 2N with status
`looping`, which the Python client, the HTTP API and `clawq run` all accept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from broker.stores.api_keys import ApiKeyStore
from orchestrator.client import Client
from tests.integration.conftest import Cluster, call, script, serve_api, start_cluster

CLAWQ = [sys.executable, "-m", "orchestrator.cli"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(groups=("fs",), loop_repeat_warn=3)


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Iterator[str]:
    yield from serve_api(cluster)


def same_read(n: int, then: str = "gave up") -> dict[str, object]:
    """n turns reading one file (the input's keys in changing order), then a final text."""
    turns: list[dict[str, object]] = [
        {"tool_calls": [call(f"r{i}", "read_file", **({"path": "a.txt", "offset": 1}))]}
        if i % 2
        else {"tool_calls": [call(f"r{i}", "read_file", offset=1, path="a.txt")]}
        for i in range(n)
    ]
    return script(*turns, {"text": then})


def results(cluster: Cluster, job_id: str) -> list[str]:
    with psycopg.connect(cluster.iso.database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT content FROM messages WHERE job_id = %s AND role = 'tool' ORDER BY seq",
            (job_id,),
        ).fetchall()
    return [r[0]["results"][0]["content"] for r in rows]


def test_a_model_repeating_itself_is_warned_then_stopped(
    cluster: Cluster, workspace: Path, api: str
) -> None:
    (workspace / "a.txt").write_text("same\n")
    job = cluster.client.submit("loop", workspace=str(workspace), script=same_read(10))
    result = job.wait(timeout=60)
    assert result.status == "looping"
    assert "read_file with the same input 6 times in a row" in result.error
    assert result.iterations == 6  # the 6th call was not run; no 7th turn
    ran = [c for c in result.tool_calls if c.worker != "orchestrator"]
    assert len(ran) == 5
    said = results(cluster, job.id)
    assert ["you called read_file with the same input" in r for r in said[:5]] == [
        False,
        False,
        True,
        True,
        True,
    ]
    assert said[5].startswith("not run: stopped: the model called read_file")
    warnings = [e for e in job.events() if e.type == "loop_warning"]
    assert [e.data["repeats"] for e in warnings] == [3, 4, 5]
    # the HTTP API and its client take the new status
    key = ApiKeyStore(cluster.client.store).create("root", admin=True)[1]
    remote = Client(api_url=api, api_key=key)
    try:
        assert remote.job(job.id).result().status == "looping"
    finally:
        remote.close()


def test_a_different_call_in_between_starts_the_count_again(
    cluster: Cluster, workspace: Path
) -> None:
    (workspace / "a.txt").write_text("same\n")
    other = {"tool_calls": [call("l", "list_files")]}
    first, second = same_read(2)["turns"][:2], same_read(2)["turns"][:2]  # type: ignore[index]
    job = cluster.client.submit(
        "no loop",
        workspace=str(workspace),
        script=script(*first, other, *second, other, *first, {"text": "done"}),
    )
    result = job.wait(timeout=60)
    assert (result.status, result.final_text) == ("completed", "done")
    assert not any("same input" in r for r in results(cluster, job.id))


def test_clawq_run_reports_looping_and_exits_1(
    cluster: Cluster, workspace: Path, tmp_path: Path
) -> None:
    (workspace / "a.txt").write_text("same\n")
    (tmp_path / "s.json").write_text(json.dumps(same_read(8)))
    out = subprocess.run(
        [*CLAWQ, "run", "loop", "--script", str(tmp_path / "s.json"), "--json"],
        cwd=workspace,
        env={**os.environ, **cluster.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stderr
    assert json.loads(out.stdout)["status"] == "looping"
