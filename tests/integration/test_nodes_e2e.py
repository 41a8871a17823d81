"""Nodes: two runtime workers under two node names; `nodes list` shows both, an `exec`
aimed at one runs in that node's process (the ledger's worker field says so), a call to a
node that is not there fails at once, and aiming at a node needs `exec(node:NAME)`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from broker.redis.presence import live_processes
from tests.integration.conftest import Cluster, call, script, start_cluster, wait_until

WORKER = [sys.executable, "-m", "orchestrator.cli", "worker", "--group", "runtime"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    for c in start_cluster(
        groups=("runtime", "sessions"), node_name="node-a", approval_timeout_s=1
    ):
        env = {**os.environ, **c.env, "CLAWQ_NODE_NAME": "node-b"}
        other = subprocess.Popen(
            [*WORKER, "--log-level", "warning"],
            env=env,
        )
        try:
            with redis.Redis.from_url(c.iso.redis_url) as r:
                wait_until(
                    lambda: any(p.get("host") == "node-b" for p in live_processes(r)),
                    30,
                    "the node-b worker",
                )
            yield c
        finally:
            other.terminate()
            other.wait(15)


def test_nodes_are_listed_and_exec_runs_on_the_node_it_names(
    cluster: Cluster, workspace: Path
) -> None:
    started = time.monotonic()
    job = cluster.client.submit(
        "where",
        workspace=str(workspace),
        allow=["exec(echo *)", "exec(node:node-b)", "exec(node:ghost)"],
        script=script(
            {"tool_calls": [call("n", "nodes", action="list")]},
            {"tool_calls": [call("b", "exec", command="echo on-b", node="node-b")]},
            {"tool_calls": [call("g", "exec", command="echo lost", node="ghost")]},
            {"tool_calls": [call("a", "exec", command="echo on-a", node="node-a")]},
            {"text": "done"},
        ),
    )
    result = job.wait(timeout=60)
    listed, on_b, ghost, on_a = result.tool_calls
    assert "node-a:" in listed.output and "node-b:" in listed.output, listed.output
    assert not on_b.is_error and "on-b" in on_b.output and "@node-b:" in on_b.worker
    assert ghost.is_error and "no live runtime worker on node ghost" in ghost.output
    assert ghost.worker == "orchestrator"  # answered at once, never queued
    assert (
        on_a.is_error and "on-a" not in on_a.output
    )  # no exec(node:node-a) rule: asked, timed out
    assert time.monotonic() - started < 30
