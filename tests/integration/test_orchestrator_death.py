"""An orchestrator killed with SIGKILL mid-job: another resumes the job from its
transcript, and the call that had already run is answered from the ledger, not re-run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from broker import keys
from tests.integration.conftest import Cluster, start_cluster, wait_until


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(heartbeat_interval_s=0.5, heartbeat_ttl_s=2)


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
        owner = client.get(keys.lease(job.id))
        assert owner is not None
        os.kill(int(owner.decode().rsplit(":", 1)[1]), signal.SIGKILL)
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
