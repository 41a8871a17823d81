"""Subagents end to end: spawned as Celery task graphs by a real `sessions` worker, run by a
real orchestrator, announced back through the debounced queue in Redis."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from broker import keys
from broker.redis import events
from broker.redis.announce import AnnounceItem, AnnounceQueue
from tests.integration.conftest import Cluster, call, script, start_cluster, wait_until

RATE_LIMIT = 40


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(
        groups=("fs", "runtime", "sessions"),
        exec_security="full",
        exec_ask="off",
        rate_limit_per_hour=RATE_LIMIT,
    )


def child(text: str) -> dict[str, Any]:
    return script({"text": text})


def sleeper(seconds: int) -> dict[str, Any]:
    """A child that works until it is stopped."""
    return script(
        {"tool_calls": [call("z", "exec", command=f"sleep {seconds}")]}, {"text": "slept"}
    )


def session_jobs(cluster: Cluster, session: str) -> list[dict[str, Any]]:
    return cluster.client.store.conn.execute(
        "SELECT id, status, spec FROM jobs WHERE session_id = %s ORDER BY created_at", (session,)
    ).fetchall()


def announced_after_a_marker(cluster: Cluster, session: str) -> list[dict[str, Any]]:
    """The session's jobs once a marker announcement, queued now, has been delivered: any
    announcement queued before it would be delivered before it, or in its batch. A positive
    signal to wait on, instead of sleeping and asserting that nothing came."""
    with redis.Redis.from_url(cluster.iso.redis_url) as client:
        queue = AnnounceQueue(client, debounce_s=0.1)
        queue.push(session, AnnounceItem(child="m", label="marker", status="completed", result="m"))

    def delivered() -> list[dict[str, Any]]:
        jobs = session_jobs(cluster, session)
        return jobs if any("[subagent marker" in j["spec"]["prompt"] for j in jobs) else []

    return wait_until(delivered, timeout=30, what="the marker announcement")  # type: ignore[no-any-return]


def running_slots(cluster: Cluster) -> int:
    with redis.Redis.from_url(cluster.iso.redis_url) as client:
        return int(client.zcount(keys.SUBAGENTS_RUNNING, int(time.time() * 1000), "+inf"))


def test_three_children_reach_the_parent_as_one_batch(cluster: Cluster, workspace: Path) -> None:
    parent = cluster.client.submit(
        "split the work",
        workspace=str(workspace),
        script={
            "turns": [
                {
                    "tool_calls": [
                        call(f"s{n}", "sessions_spawn", task=f"part {n}", label=f"part-{n}")
                        for n in (1, 2, 3)
                    ]
                },
                {"text": "the parts are running"},
            ],
            "subagents": {f"part-{n}": child(f"part {n} is done") for n in (1, 2, 3)},
            "on_announce": script({"text": "all parts are in"}),
        },
    )
    result = parent.wait(timeout=60)
    assert result.status == "completed", result
    assert all("started" in c.output and c.queue == "sessions" for c in result.tool_calls)

    # the announcement starts a new job of the parent's session, with one batched message
    jobs = wait_until(
        lambda: len(session_jobs(cluster, parent.id)) == 2 and session_jobs(cluster, parent.id)
    )
    follow_up = cluster.client.job(jobs[1]["id"])
    assert follow_up.wait(timeout=60).final_text == "all parts are in"
    prompt = jobs[1]["spec"]["prompt"]
    assert prompt.startswith("3 subagents finished:")
    for n in (1, 2, 3):
        assert f"[subagent part-{n} completed]\npart {n} is done" in prompt

    tree = parent.subagents()
    assert sorted(s.label for s in tree) == ["part-1", "part-2", "part-3"]
    assert all(s.status == "completed" and s.depth == 1 and s.parent_id == parent.id for s in tree)
    seen = [e.type for e in events.read(cluster.client.redis, parent.id, after="0", block_ms=1)]
    assert seen.count("subagent_spawned") == 3 and seen.count("subagent_finished") == 3
    assert "announce_delivered" in seen
    assert running_slots(cluster) == 0


def test_sync_spawn_returns_the_result_and_limits_are_errors(
    cluster: Cluster, workspace: Path
) -> None:
    parent = cluster.client.submit(
        "ask a helper",
        workspace=str(workspace),
        script={
            "turns": [
                {"tool_calls": [call("r", "spawn", task="answer", label="helper", mode="run")]},
                {
                    "tool_calls": [
                        call(f"x{n}", "sessions_spawn", task="more", label="helper")
                        for n in range(5)
                    ]
                },
                {"text": "done"},
            ],
            "subagents": {
                "helper": script(
                    # a leaf may not spawn: the tool is not even offered to it
                    {"tool_calls": [call("deeper", "sessions_spawn", task="x", label="helper")]},
                    {"text": "forty-two"},
                )
            },
        },
    )
    result = parent.wait(timeout=90)
    by_id = {c.id: c for c in result.tool_calls}
    assert by_id["r"].output == "forty-two" and not by_id["r"].is_error
    spawned = [by_id[f"x{n}"] for n in range(5)]
    rejected = [c for c in spawned if c.is_error]
    assert len(rejected) == 1  # the sync child counts: 5 children per parent until archived
    assert rejected[0].output == (
        "spawn rejected: this agent has too many subagents (finished ones count until "
        "archived) (children: 5 of 5)"
    )
    helper = cluster.client.job(parent.subagents()[0].id).result()
    denied = helper.tool_calls[0]
    assert denied.is_error and denied.decision == "deny:policy", denied
    assert denied.output == "sessions_spawn is not available to this agent"


def test_cancel_last_label_all_and_steer(cluster: Cluster, workspace: Path) -> None:
    long_message = "é" * 3000  # 6000 bytes: the respawned child gets the first 4000
    parent = cluster.client.submit(
        "keep them busy",
        workspace=str(workspace),
        script={
            "turns": [
                {
                    "tool_calls": [
                        call(f"s{n}", "sessions_spawn", task=f"work {n}", label=label)
                        for n, label in enumerate(["a", "b", "c"])
                    ]
                },
                {"tool_calls": [call("s4", "sessions_spawn", task="work 4", label="d")]},
                {"tool_calls": [call("k1", "subagents", action="cancel", target="last")]},
                {"tool_calls": [call("k2", "subagents", action="cancel", target="b")]},
                {
                    "tool_calls": [
                        call("st", "subagents", action="steer", target="a", message=long_message)
                    ]
                },
                {"tool_calls": [call("ls", "subagents", action="list")]},
                {"tool_calls": [call("k3", "subagents", action="cancel", target="all")]},
                {"tool_calls": [call("k4", "subagents", action="cancel", target="all")]},
                {"text": "stopped them all"},
            ],
            "subagents": {"*": sleeper(30)},
        },
    )
    result = parent.wait(timeout=90)
    out = {c.id: c for c in result.tool_calls}
    assert out["k1"].output.startswith("cancelled 1 subagent(s): d (")
    assert out["k2"].output.startswith("cancelled 1 subagent(s): b (")
    assert out["st"].output.startswith("steered 'a':") and not out["st"].is_error
    assert out["k3"].output.startswith("cancelled 2 subagent(s): c (")  # c and the new a
    assert out["k4"].is_error and out["k4"].output.startswith("no running subagent")
    states = {line.split()[1]: line.split()[2] for line in out["ls"].output.splitlines()[:4]}
    assert states.pop("'c'") in {"queued", "running"}
    assert states == {"'a'": "archived", "'b'": "cancelled", "'d'": "cancelled"}

    tree = {(s.label, s.archived): s for s in parent.subagents()}
    assert len(tree) == 5
    assert all(s.status == "cancelled" for s in tree.values()), tree
    steered = tree[("a", False)]
    prompt = cluster.client.store.job(steered.id)["spec"]["prompt"]  # type: ignore[index]
    assert prompt == "é" * 2000 and len(prompt.encode()) == 4000
    assert tree[("a", True)].id != steered.id
    wait_until(lambda: running_slots(cluster) == 0, timeout=10)
    jobs = announced_after_a_marker(cluster, parent.id)  # cancelled children are not announced
    assert len(jobs) == 2 and jobs[1]["spec"]["prompt"] == "[subagent marker completed]\nm"


def test_sessions_send_starts_a_turn_in_a_finished_session(
    cluster: Cluster, workspace: Path
) -> None:
    other = cluster.client.submit(
        "wait for news",
        workspace=str(workspace),
        script={"turns": [{"text": "idle"}], "on_announce": script({"text": "news read"})},
    )
    other.wait(timeout=60)
    sender = cluster.client.submit(
        "tell the other session",
        workspace=str(workspace),
        script=script(
            {
                "tool_calls": [
                    call("m", "sessions_send", session_id=other.id, message="the build is green"),
                    call("bad", "sessions_send", session_id="nope", message="x"),
                ]
            },
            {"text": "told"},
        ),
    )
    calls = {c.id: c for c in sender.wait(timeout=60).tool_calls}
    assert calls["m"].output == f"sent to session {other.id}"
    assert calls["bad"].is_error and "no session nope of yours" in calls["bad"].output
    jobs = wait_until(lambda: (found := session_jobs(cluster, other.id))[1:] and found)
    assert jobs[1]["spec"]["prompt"] == f"[message from session {sender.id}]\nthe build is green"
    assert cluster.client.job(jobs[1]["id"]).wait(timeout=60).final_text == "news read"


def test_a_subagent_tree_shares_its_root_sessions_rate_limit(
    cluster: Cluster, workspace: Path
) -> None:
    listing = [call(f"l{n}", "list_files") for n in range(RATE_LIMIT // 2)]
    parent = cluster.client.submit(
        "many small calls",
        workspace=str(workspace),
        script={
            "turns": [
                {
                    "tool_calls": [
                        call("r", "spawn", task="list a lot", label="lister", mode="sync")
                    ]
                },
                {"text": "done"},
            ],
            "subagents": {
                "lister": script({"tool_calls": listing}, {"tool_calls": listing}, {"text": "ok"})
            },
        },
    )
    parent.wait(timeout=60)
    child_calls = cluster.client.job(parent.subagents()[0].id).result().tool_calls
    limited = [c for c in child_calls if c.decision == "deny:rate_limit"]
    assert len(child_calls) == RATE_LIMIT and len(limited) == 1  # the parent's spawn counted
    assert limited[0].output.startswith("rate limit reached: 40 tool calls")


def test_a_running_parent_reads_the_announcement_at_its_next_turn(
    cluster: Cluster, workspace: Path
) -> None:
    parent = cluster.client.submit(
        "delegate and keep working",
        workspace=str(workspace),
        script={
            "turns": [
                {"tool_calls": [call("s", "sessions_spawn", task="quick", label="quick")]},
                {"tool_calls": [call("w", "exec", command="sleep 3")]},  # the child ends meanwhile
                {"text": "both done"},
            ],
            "subagents": {"quick": child("quick result")},
        },
    )
    assert parent.wait(timeout=60).final_text == "both done"
    rows = cluster.client.store.transcript(parent.id, 20)
    assert [r["role"] for r in rows] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "user",
        "assistant",
    ]
    assert rows[5]["content"]["text"] == "[subagent quick completed]\nquick result"
    jobs = announced_after_a_marker(cluster, parent.id)  # delivered into the job, no new one
    assert len(jobs) == 2 and "quick result" not in jobs[1]["spec"]["prompt"]


def test_cancelling_a_parent_cancels_its_children(cluster: Cluster, workspace: Path) -> None:
    parent = cluster.client.submit(
        "spawn and wait",
        workspace=str(workspace),
        script={
            "turns": [
                {
                    "tool_calls": [
                        call(f"s{n}", "sessions_spawn", task="work", label=f"w{n}") for n in (1, 2)
                    ]
                },
                {"tool_calls": [call("w", "exec", command="sleep 30")]},
                {"text": "never"},
            ],
            "subagents": {"*": sleeper(30)},
        },
    )
    wait_until(lambda: len(parent.subagents()) == 2 and running_slots(cluster) == 2)
    parent.cancel()
    assert parent.wait(timeout=30).status == "cancelled"
    wait_until(lambda: all(s.status == "cancelled" for s in parent.subagents()), timeout=15)
    wait_until(lambda: running_slots(cluster) == 0, timeout=10)


def test_a_job_queued_in_the_session_gets_the_announcement(
    cluster: Cluster, workspace: Path
) -> None:
    from broker.protocol import AGENT_RUN_TASK, AGENTS_QUEUE, JobSpec
    from broker.redis.announce import AnnounceItem, AnnounceQueue

    first = cluster.client.submit("first", workspace=str(workspace), script=child("first done"))
    first.wait(timeout=60)
    waiting = JobSpec(
        prompt="second", workspace=str(workspace), script=child("second done"), admin=True
    )
    cluster.client.store.create_job("queued-job-0001", session_id=first.id, spec=waiting)
    with redis.Redis.from_url(cluster.iso.redis_url) as client:
        item = AnnounceItem(child="c-9", label="late", status="completed", result="news")
        AnnounceQueue(client, debounce_s=0).push(first.id, item)
        wait_until(lambda: client.llen(keys.inbox("queued-job-0001")) == 1, timeout=10)
    assert len(session_jobs(cluster, first.id)) == 2  # no third job next to the queued one
    cluster.client.app.send_task(
        AGENT_RUN_TASK,
        kwargs={"job_id": "queued-job-0001"},
        queue=AGENTS_QUEUE,
        task_id="queued-job-0001",
    )
    assert cluster.client.job("queued-job-0001").wait(timeout=60).final_text == "second done"
    texts = [r["content"].get("text") for r in cluster.client.store.transcript(first.id, 20)]
    assert texts[-3:] == ["second", "[subagent late completed]\nnews", "second done"]


def test_cancel_by_id_from_a_later_job_of_the_session(cluster: Cluster, workspace: Path) -> None:
    """A child's id is only known once it exists: a later job of the parent's session (as
    an announcement or a user would start) cancels it by that id."""
    from broker.protocol import AGENT_RUN_TASK, AGENTS_QUEUE, JobSpec

    parent = cluster.client.submit(
        "start two",
        workspace=str(workspace),
        script={
            "turns": [
                {
                    "tool_calls": [
                        call(f"s{n}", "sessions_spawn", task="work", label=f"w{n}") for n in (1, 2)
                    ]
                },
                {"text": "started"},
            ],
            "subagents": {"*": sleeper(30)},
        },
    )
    parent.wait(timeout=60)
    first, second = sorted(parent.subagents(), key=lambda s: s.label)
    later = JobSpec(
        prompt="stop w1",
        workspace=str(workspace),
        admin=True,  # an operator's, as the direct client's are
        script=script(
            {"tool_calls": [call("k", "subagents", action="cancel", target=first.id)]},
            {"tool_calls": [call("k2", "subagents", action="cancel", target="all")]},
            {"text": "stopped"},
        ),
    )
    cluster.client.store.create_job("later-job-0001", session_id=parent.id, spec=later)
    cluster.client.app.send_task(
        AGENT_RUN_TASK,
        kwargs={"job_id": "later-job-0001"},
        queue=AGENTS_QUEUE,
        task_id="later-job-0001",
    )
    k, k2 = cluster.client.job("later-job-0001").wait(timeout=60).tool_calls
    assert k.output == f"cancelled 1 subagent(s): w1 ({first.id})"
    assert cluster.client.job(first.id).result().status == "cancelled"
    assert k2.output == f"cancelled 1 subagent(s): w2 ({second.id})"  # only w2 was left
    wait_until(lambda: running_slots(cluster) == 0, timeout=10)
