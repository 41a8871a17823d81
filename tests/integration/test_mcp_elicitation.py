"""MCP elicitation: a real MCP server (tests/mcp_servers/elicit_server.py, built with the
SDK) asks a person during a call, through a real `mcp` worker. The question is an
`input_requested` of the job, answered (or declined) like ask_user's; the answer is checked
against the server's schema, and the server's result says what it received. A job nobody
can answer (a subagent without a user) is declined at once; an unanswered question ends as
`cancel` at `mcp_elicitation_timeout_s`, the call's idle limit paused meanwhile."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.stores import requests
from broker.stores.api_keys import ApiKeyStore
from orchestrator.client import ClientError, Job
from tests.integration.conftest import (
    Cluster,
    call,
    script,
    serve_api,
    start_cluster,
    wait_until,
)

WAIT_S = 6.0  # mcp_elicitation_timeout_s of this cluster
IDLE_S = 2.0  # the servers' idle limit: shorter than the wait, which pauses it


def server(*args: str) -> dict[str, object]:
    command = [sys.executable, "-m", "tests.mcp_servers.elicit_server", *args]
    return {"command": command[0], "args": command[1:], "idle_timeout_s": IDLE_S}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    for cluster in start_cluster(
        groups=("mcp", "sessions"),
        mcp_health_interval_s=1,
        mcp_elicitation_timeout_s=WAIT_S,
    ):
        # `ask` speaks 2026-07-28 (the question rides the call's result); `old` 2025-11-25
        # (the question is a request of its own during the call)
        cluster.client.mcp.add({"mcpServers": {"ask": server(), "old": server("legacy")}})
        cluster.client.mcp.grant("ask", agent="main", by="test")
        cluster.client.mcp.grant("old", agent="main", by="test")
        wanted = {"mcp_ask__book", "mcp_old__reserve"}
        wait_until(
            lambda c=cluster, w=wanted: w <= {t.exposed_name for t in c.client.mcp.tools()},
            what="the catalog",
        )
        yield cluster


def asked(job: Job) -> dict[str, object]:
    for event in job.events():
        if event.type == "input_requested":
            return event.data
    raise AssertionError("no input_requested event")


def booking(cluster: Cluster, workspace: Path, tool: str, user: str = "") -> Job:
    return cluster.client.submit(
        "book a table",
        workspace=str(workspace),
        user=user,
        admin=not user,
        script=script({"tool_calls": [call("b", tool, table="t7")]}, {"text": "done"}),
    )


def test_a_server_asks_and_a_person_answers(cluster: Cluster, workspace: Path) -> None:
    job = booking(cluster, workspace, "mcp_ask__book", user="alice")
    data = asked(job)
    request = str(data["request_id"])
    assert data["kind"] == "elicitation" and data["server"] == "ask" and data["call_id"] == "b"
    assert data["question"] == "Which day, and for how many, at table t7?"
    schema = data["schema"]
    assert isinstance(schema, dict) and schema["required"] == ["date", "guests"]
    (listed,) = [r for r in cluster.client.requests("alice") if r.id == request]
    assert listed.kind == "elicitation" and listed.call_id == "b#e1"
    assert listed.requested_schema == schema
    # a wrong answer is refused with what the schema wants, and nothing is sent
    with pytest.raises(ClientError, match="guests: 'many' is not of type 'integer'"):
        job.answer(request, {"date": "2025-05-01", "guests": "many"})
    with pytest.raises(ClientError, match="'date' is a required property"):
        job.answer(request, ["guests=2"])
    with pytest.raises(ClientError, match="guests: 40 is greater than the maximum of 12"):
        job.answer(request, '{"date": "2025-05-01", "guests": 40}')
    time.sleep(IDLE_S + 1)  # past the call's idle limit: a person's wait pauses it
    job.answer(request, ["date=2025-05-01", "guests=2", "outside=yes"], by="alice")
    result = job.wait(timeout=60)
    (b,) = result.tool_calls
    assert not b.is_error, b.output
    assert "booked t7 on 2025-05-01 for 2 outside" in b.output  # what the server received
    row = requests.request(cluster.client.store.conn, request)
    assert row is not None and row.status == "answered" and row.answered_by == "alice"
    assert row.answer == {"date": "2025-05-01", "guests": 2, "outside": True}
    resolved = [e.data for e in job.events() if e.type == "input_resolved"]
    assert resolved == [{"request_id": request, "call_id": "b", "status": "answered"}]


def test_a_person_declines_an_older_servers_question(cluster: Cluster, workspace: Path) -> None:
    job = booking(cluster, workspace, "mcp_old__reserve")
    request = str(asked(job)["request_id"])
    with pytest.raises(ClientError, match="give an answer"):
        job.answer(request)
    job.answer(request, decline=True)
    (r,) = job.wait(timeout=60).tool_calls
    assert not r.is_error and "not booked: the person chose decline" in r.output
    row = requests.request(cluster.client.store.conn, request)
    assert row is not None and row.status == "declined"


def test_an_unanswered_question_ends_as_cancel(cluster: Cluster, workspace: Path) -> None:
    job = booking(cluster, workspace, "mcp_ask__book")
    request = str(asked(job)["request_id"])
    started = time.monotonic()
    (b,) = job.wait(timeout=60).tool_calls
    assert WAIT_S - 1 < time.monotonic() - started < WAIT_S + 10
    assert not b.is_error and "not booked: the person chose cancel" in b.output, b.output
    row = requests.request(cluster.client.store.conn, request)
    assert row is not None and row.status == "timeout"
    with pytest.raises(ClientError, match="already timeout"):
        job.answer(request, {"date": "2025-05-01", "guests": 2})


def test_a_job_nobody_can_answer_is_declined_at_once(cluster: Cluster, workspace: Path) -> None:
    parent = cluster.client.submit(
        "delegate",
        workspace=str(workspace),
        script={
            "turns": [
                {"tool_calls": [call("s", "spawn", task="book", label="bk", mode="sync")]},
                {"text": "done"},
            ],
            "subagents": {
                "bk": script(
                    {"tool_calls": [call("b", "mcp_ask__book", table="t7")]}, {"text": "x"}
                )
            },
        },
    )
    started = time.monotonic()
    result = parent.wait(timeout=60)
    assert time.monotonic() - started < WAIT_S  # no wait for a person
    (child,) = parent.subagents()
    (b,) = cluster.client.job(child.id).result().tool_calls
    assert not b.is_error and "not booked: the person chose decline" in b.output, b.output
    assert not [e for e in cluster.client.job(child.id).events() if e.type == "input_requested"]
    assert result.status == "completed"


def test_answered_and_declined_over_the_api_and_the_inbox_form(
    cluster: Cluster, workspace: Path
) -> None:
    key = ApiKeyStore(cluster.client.store).create("carol")[1]
    for api in serve_api(cluster):
        with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {key}"}) as carol:
            first = booking(cluster, workspace, "mcp_ask__book", user="carol")
            request = str(asked(first)["request_id"])
            path = f"/v1/jobs/{first.id}/inputs/{request}"
            wrong = carol.post(path, json={"answer": {"date": "2025-05-02", "guests": "x"}})
            assert wrong.status_code == 400 and "guests" in wrong.text, wrong.text
            both = carol.post(path, json={"answer": {"guests": 2}, "decline": True})
            assert both.status_code == 422, both.text
            # the inbox draws the server's fields; the form's answer is typed by the schema
            page = carol.get("/v1/inbox").text
            assert 'name="f.date" required' in page and 'type="number" step="1"' in page
            assert '<input type="checkbox" name="f.outside" value="true">' in page
            form = {"f.date": "2025-05-02", "f.guests": "3", "decision": "answered"}
            posted = carol.post(f"/v1/inbox/{request}", data=form)
            assert posted.status_code == 303, posted.text
            (b,) = first.wait(timeout=60).tool_calls
            assert "booked t7 on 2025-05-02 for 3" in b.output and "outside" not in b.output
            second = booking(cluster, workspace, "mcp_old__reserve", user="carol")
            request = str(asked(second)["request_id"])
            declined = carol.post(f"/v1/jobs/{second.id}/inputs/{request}", json={"decline": True})
            assert declined.status_code == 204, declined.text
            (r,) = second.wait(timeout=60).tool_calls
            assert "not booked: the person chose decline" in r.output
