"""The end of a subagent's life: archived after the delay (its parent may spawn again), and
announcements that wait in Redis while no orchestrator runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from broker import keys
from broker.redis.announce import AnnounceItem, AnnounceQueue
from tests.integration.conftest import Cluster, call, script, start_cluster, wait_until


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(groups=("sessions",), subagent_archive_after_s=1.0)


def test_finished_children_are_archived(cluster: Cluster, workspace: Path) -> None:
    parent = cluster.client.submit(
        "one child",
        workspace=str(workspace),
        script={
            "turns": [
                {"tool_calls": [call("s", "spawn", task="quick", label="q", mode="sync")]},
                {"text": "done"},
            ],
            "subagents": {"q": script({"text": "quick answer"})},
        },
    )
    assert parent.wait(timeout=60).tool_calls[0].output == "quick answer"
    with redis.Redis.from_url(cluster.iso.redis_url) as client:
        assert client.scard(keys.subagent_children(parent.id)) in {0, 1}
        wait_until(lambda: parent.subagents()[0].archived)
        assert client.scard(keys.subagent_children(parent.id)) == 0  # counts no more
    assert parent.subagents()[0].status == "completed"


def test_announcements_wait_in_redis_for_an_orchestrator(cluster: Cluster, workspace: Path) -> None:
    parent = cluster.client.submit(
        "listen",
        workspace=str(workspace),
        script={"turns": [{"text": "idle"}], "on_announce": script({"text": "heard it"})},
    )
    parent.wait(timeout=60)
    orchestrator = cluster.stack.procs[0]  # the stack starts its orchestrator first
    orchestrator.kill()
    orchestrator.wait()
    with redis.Redis.from_url(cluster.iso.redis_url) as client:
        queue = AnnounceQueue(client, debounce_s=0.1)
        item = AnnounceItem(child="c-1", label="late", status="completed", result="found")
        queue.push(parent.id, item)
        due = client.zscore(keys.ANNOUNCE_DUE, parent.id)
        assert due is not None
        wait_until(lambda: time.time() > due + 0.2, what="the batch being due")
        assert client.llen(keys.announce(parent.id)) == 1  # due, and nobody took it
    replacement = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "orchestrator", "--log-level", "warning"],
        env={**os.environ, **cluster.env},
    )
    try:
        rows = wait_until(
            lambda: (
                (
                    found := cluster.client.store.conn.execute(
                        "SELECT id, spec FROM jobs WHERE session_id = %s ORDER BY created_at",
                        (parent.id,),
                    ).fetchall()
                )[1:]
                and found
            )
        )
        assert rows[1]["spec"]["prompt"] == "[subagent late completed]\nfound"
        assert cluster.client.job(rows[1]["id"]).wait(timeout=60).final_text == "heard it"
    finally:
        replacement.terminate()
        replacement.wait(15)
