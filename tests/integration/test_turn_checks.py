"""A turn starts on the control channel's word: a cancel or a steer is pushed, and an
announcement handed to a running job is announced there, so most turns do not read the job's
cancel flag and inbox in Redis. What the channel did not carry is still seen: a cancel flag
set without its push stops the job within `turn_check_s`, and a delivery is read by the
next turn, not by the next look."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker import keys
from broker.redis.announce import AnnounceQueue
from orchestrator.client import Job
from tests.integration.conftest import Cluster, start_cluster, wait_until

CHECK_S = 3.0  # long against a turn (a few ms): a look by the clock is far from the push's
TURNS = 3000


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # the same call every turn: no loop guard
    yield from start_cluster(groups=("fs",), turn_check_s=CHECK_S, loop_repeat_warn=0)


def long_job(cluster: Cluster, workspace: Path) -> Job:
    turn = {"tool_calls": [{"id": "c", "name": "list_files", "input": {}}]}
    return cluster.client.submit(
        "many turns",
        workspace=str(workspace),
        max_iterations=TURNS + 1,
        script={"turns": [turn] * TURNS + [{"text": "done"}]},
    )


def current_turn(cluster: Cluster, job: Job) -> int:
    """The turn the job has started last, by its events."""
    for _, fields in cluster.client.redis.xrevrange(keys.events(job.id), count=200):
        event = json.loads(fields[b"e"])
        if event["type"] == "turn_started":
            return int(event["data"]["turn"])
    return 0


def test_a_cancel_whose_push_was_lost_stops_the_job_within_the_check(
    cluster: Cluster, workspace: Path
) -> None:
    job = long_job(cluster, workspace)
    wait_until(lambda: current_turn(cluster, job) >= 20, timeout=30)
    # the flag alone, as a cancel whose push went to a channel that was not listening
    cluster.client.redis.set(keys.cancel(job.id), "cancelled by request", ex=600)
    set_at, turn_then = time.monotonic(), current_turn(cluster, job)
    result = job.wait(timeout=60)
    assert result.status == "cancelled", (result.status, turn_then)
    assert time.monotonic() - set_at < CHECK_S + 10  # seen by a look, not at the script's end
    assert current_turn(cluster, job) < TURNS


def test_an_announcement_handed_to_a_running_job_is_its_next_turns_input(
    cluster: Cluster, workspace: Path
) -> None:
    job = long_job(cluster, workspace)
    wait_until(lambda: current_turn(cluster, job) >= 20, timeout=30)
    queue = AnnounceQueue(cluster.client.redis, inbox_ttl_s=600)
    assert queue.deliver(job.id, 0, "a subagent finished: 42 files") == job.id
    handed_at = current_turn(cluster, job)
    result = job.wait(timeout=120)
    assert result.status == "completed"
    rows = cluster.client.store.transcript(job.id, 2 * TURNS + 10)
    (read_at,) = [i for i, r in enumerate(rows) if "42 files" in json.dumps(r["content"])]
    assert rows[read_at]["role"] == "user"
    turns_before = sum(r["role"] == "assistant" for r in rows[:read_at])
    # read at the start of a turn a few after it was handed (the events of the turns in
    # flight may lag), not at the look `turn_check_s` later: hundreds of turns
    assert handed_at - 1 <= turns_before <= handed_at + 20, (handed_at, turns_before)


def test_a_cancel_flag_set_while_the_channel_reconnects_is_read_at_once(
    cluster: Cluster, workspace: Path
) -> None:
    """The orchestrator's subscription is cut (Redis stays up) and the flag is set with no
    push: the channel was not listening since the job's last look, so the job's next turn
    looks again (not the look `turn_check_s` later, hundreds of turns on)."""
    job = long_job(cluster, workspace)
    wait_until(lambda: current_turn(cluster, job) >= 20, timeout=30)
    redis = cluster.client.redis
    db = redis.connection_pool.connection_kwargs.get("db", 0)
    subscribers = [c for c in redis.client_list() if int(c["db"]) == db and int(c["sub"]) > 0]
    assert subscribers  # the orchestrator's control channel (this test's own Redis db)
    for client in subscribers:
        redis.client_kill_filter(_id=client["id"])
    redis.set(keys.cancel(job.id), "cancelled by request", ex=600)
    set_at_turn = current_turn(cluster, job)
    result = job.wait(timeout=60)
    assert result.status == "cancelled"
    assert current_turn(cluster, job) <= set_at_turn + 20, (set_at_turn, current_turn(cluster, job))
