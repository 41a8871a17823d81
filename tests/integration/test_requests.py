"""A person in the loop (issue 31), through real orchestrator and worker processes: a job
whose every pending call waits for a person is parked (status `waiting`, no lease, out of
memory) and runs again when the last request is answered; `ask_user`'s answer is the
call's result; a parked job's request times out as the job chose (deny or cancel); a
parked job can be cancelled; the pending requests are listed per user."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from broker import keys
from broker.protocol import FINAL_STATUSES
from orchestrator.client import ClientError, Job
from tests.integration.conftest import Cluster, call, script, start_cluster, wait_until


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # a job waiting only for people leaves memory after half a second
    yield from start_cluster(groups=("fs", "runtime"), park_after_s=0.5, approval_timeout_s=0)


def parked(cluster: Cluster, job: Job) -> None:
    """The job is `waiting` in PostgreSQL and no orchestrator holds its lease."""
    wait_until(lambda: cluster.client.store.job_status(job.id) == "waiting", 30, "parked")
    with redis.Redis.from_url(cluster.iso.redis_url) as r:
        assert not r.exists(keys.lease(job.id))


def first(job: Job, kind: str) -> dict[str, object]:
    for event in job.events():
        if event.type == kind:
            return event.data
    raise AssertionError(f"no {kind} event")


def test_a_job_waiting_for_an_approval_is_parked_and_resumed_by_the_answer(
    cluster: Cluster, workspace: Path
) -> None:
    job = cluster.client.submit(
        "write it",
        workspace=str(workspace),
        ask=["write_file"],
        allow=["exec"],
        script=script(
            {
                "tool_calls": [
                    call("e", "exec", command="echo ran >> effects.txt"),  # runs before it parks
                    call("w", "write_file", path="a.txt", content="approved\n"),
                ]
            },
            {"text": "done"},
        ),
        user="alice",
    )
    asked = first(job, "approval_requested")
    parked(cluster, job)
    assert not (workspace / "a.txt").exists()
    listed = cluster.client.requests("alice")
    assert [(r.id, r.kind, r.tool) for r in listed] == [
        (asked["request_id"], "approval", "write_file")
    ]
    assert cluster.client.requests("bob") == []
    time.sleep(1.5)  # parked: nothing happens while nobody answers
    assert cluster.client.store.job_status(job.id) == "waiting"
    job.approve(str(asked["request_id"]), "allow-once", by="alice")
    result = job.wait(timeout=30)
    assert result.status == "completed", result
    assert (workspace / "a.txt").read_text() == "approved\n"
    assert (workspace / "effects.txt").read_text() == "ran\n"  # once, though its turn ran twice
    types = [e.type for e in job.events()]
    assert "job_waiting" in types
    started = [e.data for e in job.events() if e.type == "job_started"]
    assert [s["resumed"] for s in started] == [False, True]
    assert cluster.client.requests("alice") == []
    with pytest.raises(ClientError, match="already allow-once"):
        job.approve(str(asked["request_id"]), "deny")


def test_ask_user_is_answered_by_a_person_and_the_answer_is_the_result(
    cluster: Cluster, workspace: Path
) -> None:
    job = cluster.client.submit(
        "pick",
        workspace=str(workspace),
        script=script(
            {
                "tool_calls": [
                    call("q", "ask_user", question="Which colour?", choices=["red", "blue"])
                ]
            },
            {"text": "done"},
        ),
        user="alice",
    )
    asked = first(job, "input_requested")
    assert asked["question"] == "Which colour?" and asked["choices"] == ["red", "blue"]
    parked(cluster, job)
    request = str(asked["request_id"])
    with pytest.raises(ClientError, match="answer with one of: red, blue"):
        job.answer(request, "green")
    with pytest.raises(ClientError, match="is a question: answer it"):
        job.approve(request, "allow-once")
    job.answer(request, "blue", by="alice")
    result = job.wait(timeout=30)
    assert result.status == "completed", result
    (asked_call,) = result.tool_calls
    assert asked_call.output == "alice answered: blue" and not asked_call.is_error
    assert asked_call.worker == "person"


def test_a_parked_request_times_out_as_the_job_chose(cluster: Cluster, workspace: Path) -> None:
    turns = script(
        {"tool_calls": [call("w", "write_file", path="t.txt", content="x")]}, {"text": "ok"}
    )
    denied = cluster.client.submit(
        "deny on timeout", workspace=str(workspace), ask=["write_file"], script=turns,
        approval_timeout_s=2,
    )  # fmt: skip
    cancelled = cluster.client.submit(
        "cancel on timeout", workspace=str(workspace), ask=["write_file"], script=turns,
        approval_timeout_s=2, on_timeout="cancel",
    )  # fmt: skip
    for job in (denied, cancelled):
        parked(cluster, job)
    first_result = denied.wait(timeout=30)
    assert first_result.status == "completed"
    (refused,) = first_result.tool_calls
    assert refused.is_error and "not approved within 2s" in refused.output
    second = cancelled.wait(timeout=30)
    assert second.status == "cancelled" and "not approved in time" in second.error
    assert not (workspace / "t.txt").exists()


def test_a_parked_job_is_cancelled(cluster: Cluster, workspace: Path) -> None:
    job = cluster.client.submit(
        "never answered",
        workspace=str(workspace),
        script=script(
            {"tool_calls": [call("q", "ask_user", question="still there?")]}, {"text": "x"}
        ),
    )
    parked(cluster, job)
    job.cancel()
    result = job.wait(timeout=30)
    assert result.status == "cancelled"
    assert result.status in FINAL_STATUSES
