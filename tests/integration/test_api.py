"""The HTTP API against a real uvicorn server (`clawq api` in its own process), a real
cluster, Redis and PostgreSQL: keys, who sees what, jobs and their event streams, the
HTTP client, and custom tools defined at run time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse

from broker.config.secretbox import new_key
from broker.config.settings import Settings
from broker.stores.api_keys import ApiKeyStore
from orchestrator.api.serve import ExposureError, check_exposure
from orchestrator.client import Client, ClientError, Job
from tests.integration.conftest import (
    Cluster,
    call,
    script,
    serve_api,
    start_cluster,
    wait_until,
)

CLAWQ = [sys.executable, "-m", "orchestrator.cli"]
SECRET_KEY = new_key()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(
        groups=("fs", "runtime", "sessions"), approval_timeout_s=20, secret_key=SECRET_KEY
    )


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Iterator[str]:
    yield from serve_api(cluster)


@pytest.fixture(scope="module")
def keys(cluster: Cluster) -> dict[str, str]:
    store = ApiKeyStore(cluster.client.store)
    return {
        "alice": store.create("alice")[1],
        "bob": store.create("bob")[1],
        "admin": store.create("root", admin=True)[1],
    }


OPEN: list[httpx.Client] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while OPEN:
        OPEN.pop().close()


def http(api: str, key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    OPEN.append(httpx.Client(base_url=api, headers=headers, timeout=30))
    return OPEN[-1]


def approvals_job(workspace: Path) -> dict[str, Any]:
    return {
        "prompt": "make a file",
        "workspace": str(workspace),
        "script": script(
            {"tool_calls": [call("t", "exec", command="touch made-by-approval")]},
            {"text": "made"},
        ),
    }


def test_no_key_a_wrong_key_and_a_revoked_key_get_401(
    api: str, keys: dict[str, str], cluster: Cluster
) -> None:
    for key in (None, "clawq_000000000000_" + "x" * 43, "not-a-key"):
        response = http(api, key).get("/v1/jobs/any")
        assert response.status_code == 401 and response.json()["error"]["code"] == "unauthorized"
    revoked, secret = ApiKeyStore(cluster.client.store).create("carol")
    assert http(api, secret).get("/v1/jobs/any").status_code == 404  # live: it authenticates
    out = subprocess.run(
        [*CLAWQ, "keys", "revoke", revoked.id],
        env={**os.environ, **cluster.env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == f"revoked {revoked.id}\n"
    assert http(api, secret).get("/v1/jobs/any").status_code == 401


def test_submit_stream_with_a_resume_and_approve(
    api: str, keys: dict[str, str], workspace: Path
) -> None:
    alice = http(api, keys["alice"])
    submitted = alice.post("/v1/jobs", json=approvals_job(workspace))
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["job_id"]
    seen: list[dict[str, Any]] = []
    with connect_sse(alice, "GET", f"/v1/jobs/{job_id}/events") as source:
        assert source.response.headers["content-type"].startswith("text/event-stream")
        for sse in source.iter_sse():
            seen.append({"id": sse.id, "type": sse.event, **json.loads(sse.data)})
            if sse.event == "approval_requested":
                break  # the client goes away in the middle
    asked = seen[-1]
    assert [e["type"] for e in seen][:2] == ["job_queued", "job_started"]
    answered = alice.post(
        f"/v1/jobs/{job_id}/approvals/{asked['data']['request_id']}",
        json={"decision": "allow-once"},
    )
    assert answered.status_code == 204, answered.text
    resumed: list[dict[str, Any]] = []
    with connect_sse(
        alice, "GET", f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": asked["id"]}
    ) as source:
        for sse in source.iter_sse():
            resumed.append({"id": sse.id, "type": sse.event, **json.loads(sse.data)})
    types = [e["type"] for e in resumed]
    assert types[0] == "approval_resolved" and types[-1] == "job_finished"  # nothing repeated
    assert {e["id"] for e in seen}.isdisjoint(e["id"] for e in resumed)
    result = alice.get(f"/v1/jobs/{job_id}").json()
    assert result["status"] == "completed" and result["final_text"] == "made"
    assert (workspace / "made-by-approval").exists()


def test_cancel_and_steer_over_http(api: str, keys: dict[str, str], workspace: Path) -> None:
    alice = http(api, keys["alice"])
    sleeping = {
        "prompt": "sleep",
        "workspace": str(workspace),
        "allow": ["exec"],
        "script": script({"tool_calls": [call("s", "exec", command="sleep 30")]}, {"text": "woke"}),
    }
    first = alice.post("/v1/jobs", json=sleeping).json()["job_id"]
    wait_until(lambda: alice.get(f"/v1/jobs/{first}").json()["tool_calls"])  # the sleep is out
    assert alice.post(f"/v1/jobs/{first}/steer", json={"message": "wrap up"}).status_code == 204
    wait_until(lambda: alice.get(f"/v1/jobs/{first}").json()["status"] == "completed", timeout=20)
    steered = alice.get(f"/v1/jobs/{first}").json()
    assert steered["final_text"] == "woke" and "steered" in steered["tool_calls"][0]["output"]
    second = alice.post("/v1/jobs", json=sleeping).json()["job_id"]
    wait_until(lambda: alice.get(f"/v1/jobs/{second}").json()["tool_calls"])
    assert alice.post(f"/v1/jobs/{second}/cancel").status_code == 204
    wait_until(lambda: alice.get(f"/v1/jobs/{second}").json()["status"] == "cancelled", timeout=30)
    late = alice.post(f"/v1/jobs/{second}/steer", json={"message": "too late"})
    assert late.status_code == 409 and "has ended" in late.json()["error"]["message"]


def test_another_users_job_is_404_and_admin_routes_are_403(
    api: str, keys: dict[str, str], workspace: Path
) -> None:
    alice, bob, admin = (http(api, keys[k]) for k in ("alice", "bob", "admin"))
    job_id = alice.post("/v1/jobs", json=approvals_job(workspace)).json()["job_id"]
    for method, path in [
        ("GET", f"/v1/jobs/{job_id}"),
        ("GET", f"/v1/jobs/{job_id}/events"),
        ("GET", f"/v1/jobs/{job_id}/subagents"),
        ("POST", f"/v1/jobs/{job_id}/cancel"),
        ("GET", f"/v1/sessions/{job_id}"),
    ]:
        response = bob.request(method, path)
        assert response.status_code == 404, (path, response.text)
        assert response.json() == {
            "error": {"code": "not_found", "message": response.json()["error"]["message"]}
        }
    assert admin.get(f"/v1/jobs/{job_id}").status_code == 200  # an admin sees every job
    assert alice.get(f"/v1/sessions/{job_id}").json()["user_id"] == "alice"
    for path in ("/v1/mcp/servers", "/v1/custom-tools", "/v1/mcp/requests"):
        forbidden = bob.get(path)
        assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "forbidden"
    asked = bob.post("/v1/mcp/requests", json={"server": "nope", "reason": "x"})
    assert asked.status_code == 400  # open to users (the server just does not exist)
    for_other = bob.post("/v1/mcp/requests", json={"server": "nope", "user": "alice"})
    assert for_other.status_code == 403
    alice.post(f"/v1/jobs/{job_id}/cancel")


def test_errors_have_one_shape_and_name_the_field(api: str, keys: dict[str, str]) -> None:
    alice = http(api, keys["alice"])
    missing = alice.post("/v1/jobs", json={"workspace": "/tmp"})
    assert missing.status_code == 422
    assert missing.json()["error"]["code"] == "invalid_input"
    assert missing.json()["error"]["field"] == "prompt"
    outside = alice.post(
        "/v1/jobs", json={"prompt": "x", "workspace": "/etc", "script": {"turns": [{"text": "t"}]}}
    )
    assert outside.status_code == 403
    assert outside.json()["error"]["field"] == "user_ceilings.*.workspace_roots"
    assert outside.json()["error"]["message"].startswith("workspace /etc is outside user alice")
    assert alice.get("/openapi.json").json()["info"]["title"] == "clawq"
    assert "/v1/jobs/{job_id}/events" in alice.get("/openapi.json").json()["paths"]
    assert alice.get("/docs").status_code == 200


def test_docs_render_offline_from_the_package(api: str) -> None:
    """Issue 30: /docs was blank offline (Swagger UI came from a CDN). In Chromium with
    every request off the API's own origin refused, the page still renders the API."""
    from playwright.sync_api import Route, sync_playwright

    elsewhere: list[str] = []

    def only_the_api(route: Route) -> None:
        if route.request.url.startswith(api):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            page = chromium.new_page()
            page.route("**/*", only_the_api)
            page.goto(f"{api}/docs")
            title = page.locator(".swagger-ui .info .title")
            title.wait_for(timeout=15_000)
            assert title.inner_text().startswith("clawq")
            assert page.locator(".opblock-summary-path", has_text="/v1/jobs").count() > 0
        finally:
            chromium.close()
    assert elsewhere == []


def test_unknown_fields_are_refused_by_name(api: str, keys: dict[str, str]) -> None:
    """Issue 30: a typo'd field ("modle") was ignored, and the job ran on the default."""
    alice, admin = http(api, keys["alice"]), http(api, keys["admin"])
    script = {"turns": [{"text": "t"}]}
    cases = [
        (alice.post, "/v1/jobs", {"prompt": "x", "modle": "openai", "script": script}, "modle"),
        (
            alice.post,
            "/v1/jobs",
            {"prompt": "x", "script": script, "budget": {"turnz": 3}},
            "budget.turnz",
        ),
        (alice.post, "/v1/mcp/requests", {"server": "s", "reasn": "x"}, "reasn"),
        (
            admin.post,
            "/v1/mcp/servers",
            {"mcpServers": {"t": {"command": "x"}}, "mcpServer": {}},
            "mcpServer",
        ),
        (
            admin.post,
            "/v1/mcp/servers",
            {"mcpServers": {"t": {"command": "x", "argz": ["-v"]}}},
            "mcpServers.t.argz",
        ),
        (
            admin.put,
            "/v1/custom-tools",
            {
                "name": "t",
                "description": "d",
                "parameters": {"type": "object", "properties": {}},
                "command": "echo",
                "timeout": 5,
            },
            "timeout",
        ),
    ]
    for send, path, body, field in cases:
        refused = send(path, json=body)
        assert refused.status_code in (400, 422), (path, refused.text)
        error = refused.json()["error"]
        assert error["code"] == "invalid_input" and error.get("field") == field, (path, error)
        assert field in error["message"], error


def test_the_api_refuses_plain_http_off_loopback() -> None:
    check_exposure(Settings(), "127.0.0.1")
    check_exposure(Settings(api_behind_tls_proxy=True), "0.0.0.0")
    check_exposure(Settings(api_tls_certfile="c", api_tls_keyfile="k"), "10.0.0.5")
    with pytest.raises(ExposureError, match=r"plain HTTP on 0\.0\.0\.0"):
        check_exposure(Settings(), "0.0.0.0")
    out = subprocess.run(
        [*CLAWQ, "api", "--host", "0.0.0.0", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CLAWQ_API_BEHIND_TLS_PROXY": "false"},
    )
    assert out.returncode == 1 and "CLAWQ_API_BEHIND_TLS_PROXY" in out.stderr


# -- the same scenario through the direct client and the HTTP client --------------------


def scenario(client: Client, workspace: Path) -> None:
    job = client.submit(
        "scenario",
        workspace=str(workspace),
        script={
            "turns": [
                {"tool_calls": [call("w", "write_file", path="n.txt", content="hi\n")]},
                {"tool_calls": [call("x", "exec", command="cat n.txt")]},
                {"text": "done"},
            ]
        },
    )
    asked = next(e for e in job.events() if e.type == "approval_requested")
    job.approve(asked.data["request_id"], "allow-once")
    result = job.wait(timeout=60)
    assert result.status == "completed" and result.final_text == "done"
    write, run = result.tool_calls
    assert (write.queue, run.queue) == ("fs", "runtime") and run.output.startswith("hi")
    types = [e.type for e in job.events()]
    assert types[0] == "job_queued" and types[-1] == "job_finished"
    assert "approval_resolved" in types
    assert job.subagents() == []
    with pytest.raises(ClientError):
        job.steer("after the end")
    with pytest.raises(ClientError):
        client.submit("x", workspace=str(workspace), model="nope")


@pytest.mark.parametrize("kind", ["direct", "http"])
def test_the_http_client_passes_the_direct_clients_scenario(
    kind: str, cluster: Cluster, api: str, keys: dict[str, str], workspace: Path
) -> None:
    client = cluster.client if kind == "direct" else Client(api_url=api, api_key=keys["alice"])
    assert isinstance(client, Client)
    scenario(client, workspace)
    if kind == "http":
        assert type(client).__name__ == "RemoteClient" and isinstance(client.job("x"), Job)
        client.close()


# -- custom tools --------------------------------------------------------------------------


def define(api: str, key: str, definition: dict[str, Any]) -> httpx.Response:
    return http(api, key).put("/v1/custom-tools", json=definition)


def test_a_tool_defined_through_the_api_is_called_by_the_next_job(
    api: str, keys: dict[str, str], cluster: Cluster, workspace: Path
) -> None:
    echo = {
        "name": "echo_args",
        "description": "Print its arguments, each on a line",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string"}, "other": {"type": "string"}},
            "required": ["text"],
        },
        "command": "printf '[%s]\\n' {{.text}} {{.other}}",
    }
    created = define(api, keys["admin"], echo)
    assert created.status_code == 201, created.text
    defined_at = time.time()
    nasty = [
        "; touch pwned",
        "$(touch pwned)",
        "`touch pwned`",
        'it\'s "quoted"',
        "two\nlines; touch pwned",
        "{{.other}}",
    ]
    job = cluster.client.submit(
        "call it",
        workspace=str(workspace),
        allow=["echo_args"],
        script=script(
            {"tool_calls": [call(f"c{n}", "echo_args", text=t) for n, t in enumerate(nasty)]},
            {"tool_calls": [call("none", "echo_args", other="only other")]},
            {"text": "called"},
        ),
    )
    result = job.wait(timeout=60)
    # the job after the definition has the tool: its first call was queued to a worker
    # within a second of the PUT (no cache to expire, no restart)
    queued = [e for e in job.events() if e.type == "tool_call_queued"]
    assert queued and queued[0].data["call_id"] == "c0"
    assert queued[0].at - defined_at < 1.0, queued[0].at - defined_at
    assert result.status == "completed", result
    outputs = {c.id: c for c in result.tool_calls}
    for n, text in enumerate(nasty):
        out = outputs[f"c{n}"]
        assert not out.is_error and out.queue == "runtime", out.output
        # literal; the missing optional `other` drops its word (issue 30: 8)
        assert out.output == f"[{text}]\n[exit code 0]", out.output
    assert outputs["none"].is_error and "text" in outputs["none"].output  # the schema refused
    assert outputs["none"].worker == "orchestrator"
    assert not list(workspace.rglob("pwned"))
    # disabled: the next job does not have it; its orchestrator refuses the call, which
    # no worker sees
    assert http(api, keys["admin"]).post("/v1/custom-tools/echo_args/disable").status_code == 204
    disabled_at = time.time()
    later = cluster.client.submit(
        "again",
        workspace=str(workspace),
        allow=["echo_args"],
        script=script({"tool_calls": [call("c", "echo_args", text="x")]}, {"text": "t"}),
    )
    (gone,) = later.wait(timeout=60).tool_calls
    assert gone.is_error and gone.output.startswith("Unknown tool 'echo_args'")
    assert gone.worker == "orchestrator" and gone.queue in ("", None), gone
    (denied,) = [e for e in later.events() if e.type == "tool_call_denied"]
    assert denied.data["call_id"] == "c" and denied.data["layer"] == "validation"
    assert denied.at - disabled_at < 1.0, denied.at - disabled_at
    assert not [e for e in later.events() if e.type == "tool_call_queued"]


def test_a_template_with_an_undeclared_key_is_refused_when_defined(
    api: str, keys: dict[str, str], cluster: Cluster, tmp_path: Path
) -> None:
    bad = {
        "name": "bad_tool",
        "description": "d",
        "parameters": {"type": "object", "properties": {"a": {"type": "string"}}},
        "command": "echo {{.a}} {{.b}}",
    }
    refused = define(api, keys["admin"], bad)
    assert refused.status_code == 400
    assert (
        "command names undeclared parameters: {{.b}} (declared: a)"
        in refused.json()["error"]["message"]
    )
    not_a_schema = {**bad, "command": "echo", "parameters": {"type": "object", "properties": 3}}
    assert (
        "not a valid JSON Schema"
        in define(api, keys["admin"], not_a_schema).json()["error"]["message"]
    )
    native = define(api, keys["admin"], {**bad, "name": "exec", "command": "echo {{.a}}"})
    assert native.json()["error"] == {
        "code": "invalid_input",
        "message": "name: exec is a native tool's name",
        "field": "name",
    }
    injecting = {**bad, "command": 'printf "%s|" "got: {{.a}}"'}  # issue 27: 1
    refused = define(api, keys["admin"], injecting)
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "command"
    assert refused.json()["error"]["message"].startswith(
        "command: {{.a}} is inside double quotes beside other text"
    )
    for name, definition in [("t", bad), ("i", injecting)]:
        (tmp_path / f"{name}.json").write_text(json.dumps(definition))
    cli = subprocess.run(
        [*CLAWQ, "tools", "add", str(tmp_path / "t.json")],
        env={**os.environ, **cluster.env},
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 2 and "undeclared parameters: {{.b}}" in cli.stderr
    cli = subprocess.run(
        [*CLAWQ, "tools", "add", str(tmp_path / "i.json")],
        env={**os.environ, **cluster.env},
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 2 and "{{.a}} is inside double quotes" in cli.stderr
    assert cluster.client.custom_tools.list() == [] or all(
        t.name != "bad_tool" for t in cluster.client.custom_tools.list()
    )


def test_env_secrets_are_sealed_and_redacted(
    api: str, keys: dict[str, str], cluster: Cluster, workspace: Path
) -> None:
    secret = "sup3r-s3cret-" + os.urandom(6).hex()
    tool = {
        "name": "show_token",
        "description": "Print the deploy token",
        "command": "echo token is $DEPLOY_TOKEN",
        "env": {"DEPLOY_TOKEN": secret},
    }
    made = define(api, keys["admin"], tool)
    assert made.status_code == 201 and secret not in made.text
    assert made.json()["env_names"] == ["DEPLOY_TOKEN"] and "env" not in made.json()
    dump = cluster.client.store.conn.execute(
        "SELECT row_to_json(t)::text AS row FROM custom_tools t"
    ).fetchall()
    assert dump and all(secret not in r["row"] for r in dump)
    listed = http(api, keys["admin"]).get("/v1/custom-tools").text
    assert secret not in listed
    job = cluster.client.submit(
        "show it",
        workspace=str(workspace),
        allow=["show_token"],
        script=script({"tool_calls": [call("t", "show_token")]}, {"text": "shown"}),
    )
    (only,) = job.wait(timeout=60).tool_calls
    assert not only.is_error and only.output.startswith("token is [REDACTED]"), only.output
    assert secret not in json.dumps([e.model_dump() for e in job.events()])


def test_the_api_process_serves_its_metrics(api: str) -> None:
    response = http(api, None).get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert "process_cpu_seconds_total" in response.text  # this process's runtime
