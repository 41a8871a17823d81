"""A call whose queue has no live worker: a `tool_call_waiting` event names the queue,
`clawq status` lists the call, and after the schedule-to-start timeout the model gets a
clear error instead of the job hanging; a worker started later skips the stale message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.integration.conftest import Cluster, script, start_cluster, wait_until


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(
        groups=("fs",), call_waiting_after_s=1.0, schedule_to_start_timeout_s=6.0
    )


def test_a_call_no_worker_takes_is_announced_then_answered(
    cluster: Cluster, workspace: Path
) -> None:
    job = cluster.client.submit(
        "run it",
        workspace=str(workspace),
        allow=["exec"],
        script=script(
            {"tool_calls": [{"id": "x", "name": "exec", "input": {"command": "touch ran"}}]},
            {"text": "done"},
        ),
    )
    env = {**os.environ, **cluster.env}

    def waiting() -> list[dict[str, object]]:
        shown = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "status", "--json"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        return list(json.loads(shown.stdout)["waiting"])

    wait_until(lambda: any(w["job"] == job.id for w in waiting()), 20, "the call listed")
    (listed,) = [w for w in waiting() if w["job"] == job.id]
    assert listed["queue"] == "runtime" and listed["tool"] == "exec"

    result = job.wait(timeout=60)
    assert result.status == "completed"
    (call,) = result.tool_calls
    assert call.is_error and "no worker took exec from the 'runtime' queue" in call.output
    told = [e for e in job.events() if e.type == "tool_call_waiting"]
    assert len(told) == 1 and told[0].data["queue"] == "runtime"
    assert not any(w["job"] == job.id for w in waiting())  # no longer listed

    client = redis.Redis.from_url(cluster.iso.redis_url)
    late = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "worker",
            "--group",
            "runtime",
            "--log-level",
            "warning",
        ],
        env=env,
    )
    try:  # a worker that comes later takes the stale message and skips it
        wait_until(lambda: client.llen("runtime") == 0, 60, "the stale message taken")
        key = f"clawq:call:{job.id}:0:x"
        wait_until(lambda: client.hget(key, "status") == b"done", 30, "its outcome recorded")
        outcome = json.loads(client.hget(key, "outcome") or b"{}")
        assert outcome["is_error"] and "no worker took exec" in outcome["for_llm"]
    finally:
        late.terminate()
        late.wait(15)
        client.close()
    assert not (workspace / "ran").exists()
