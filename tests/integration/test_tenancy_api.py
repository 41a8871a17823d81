"""Tenancy over HTTP, walked from the OpenAPI document (issue 26): every route and method is
classified below, so a new route that is not fails the walk.

- An object route, with bob's key on alice's objects: 404, and nothing of hers changes.
- An admin route, with a user's key: 403, and nothing changes.
- Every `/v1` route, with no key, a malformed key, an unknown key, a revoked key or a real
  key id with a wrong secret: 401 (and the wrong secret does not mark the key used).
- A malformed id (a NUL byte, a newline, 300 characters) on any route that takes one: 404,
  never 500.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from broker import keys as broker_keys
from broker.protocol import Event
from broker.stores.api_keys import ApiKeyStore
from broker.stores.artifacts import ArtifactStore
from tests.integration.conftest import Cluster, call, script, serve_api, start_cluster, wait_until

ROOT = Path(os.environ.get("TMPDIR", "/tmp")) / f"clawq-tenancy-api-{os.getpid()}"

# Every route of the OpenAPI document: "object" (another user's is 404), "admin" (a user's
# key is 403), "self" (open to users, for themselves only: checked by its own test).
ROUTES: dict[tuple[str, str], str] = {
    ("POST", "/v1/jobs"): "self",
    ("GET", "/v1/jobs/{job_id}"): "object",
    ("GET", "/v1/jobs/{job_id}/events"): "object",
    ("POST", "/v1/jobs/{job_id}/approvals/{request_id}"): "object",
    ("POST", "/v1/jobs/{job_id}/cancel"): "object",
    ("POST", "/v1/jobs/{job_id}/steer"): "object",
    ("GET", "/v1/jobs/{job_id}/subagents"): "object",
    ("GET", "/v1/sessions/{session_id}"): "object",
    ("GET", "/v1/sessions/{session_id}/canvas"): "object",
    ("GET", "/v1/sessions/{session_id}/canvas/events"): "object",
    ("GET", "/v1/sessions/{session_id}/canvas-link"): "object",
    ("GET", "/v1/artifacts/{artifact_id}"): "object",
    ("POST", "/v1/jobs/{job_id}/inputs/{request_id}"): "object",
    ("POST", "/v1/jobs/{job_id}/replay"): "object",
    ("GET", "/v1/jobs/{job_id}/diff"): "object",
    ("POST", "/v1/jobs/{job_id}/fork"): "object",
    ("POST", "/v1/inbox/{request_id}"): "object",
    ("GET", "/v1/requests"): "self",
    ("GET", "/v1/inbox"): "self",
    ("GET", "/v1/inbox-link"): "self",
    ("GET", "/v1/mcp/servers"): "admin",
    ("POST", "/v1/mcp/servers"): "admin",
    ("DELETE", "/v1/mcp/servers/{name}"): "admin",
    ("GET", "/v1/mcp/tools"): "admin",
    ("GET", "/v1/mcp/grants"): "admin",
    ("POST", "/v1/mcp/grants"): "admin",
    ("DELETE", "/v1/mcp/grants/{server}"): "admin",
    ("POST", "/v1/mcp/requests"): "self",
    ("GET", "/v1/mcp/requests"): "admin",
    ("POST", "/v1/mcp/requests/{request_id}/review"): "admin",
    ("POST", "/v1/mcp/servers/{name}/login"): "admin",
    ("POST", "/v1/mcp/login"): "admin",
    ("GET", "/oauth/mcp/callback"): "public",  # the sealed state is its key
    ("POST", "/hooks/telegram/{name}"): "public",  # the channel's webhook secret is its key
    ("POST", "/hooks/slack/{name}"): "public",  # Slack's request signature is its key
    ("GET", "/v1/custom-tools"): "admin",
    ("PUT", "/v1/custom-tools"): "admin",
    ("GET", "/v1/custom-tools/{name}"): "admin",
    ("DELETE", "/v1/custom-tools/{name}"): "admin",
    ("POST", "/v1/custom-tools/{name}/disable"): "admin",
    ("POST", "/v1/custom-tools/{name}/enable"): "admin",
    ("GET", "/healthz"): "public",
}

TOOL = {
    "name": "walked",
    "description": "Does nothing",
    "parameters": {"type": "object", "properties": {}},
    "command": "true",
}
SERVER = {"mcpServers": {"walked": {"url": "http://127.0.0.1:9/mcp"}}}
# A valid body per route, so what refuses bob is ownership or the role, not validation.
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/v1/jobs/{job_id}/approvals/{request_id}"): {"decision": "allow-once"},
    ("POST", "/v1/jobs/{job_id}/steer"): {"message": "bob was here"},
    ("POST", "/v1/jobs/{job_id}/inputs/{request_id}"): {"answer": "bob was here"},
    ("POST", "/v1/jobs/{job_id}/replay"): {},
    ("POST", "/v1/jobs/{job_id}/fork"): {"at": 1},
    ("POST", "/v1/mcp/servers"): {"mcpServers": {"bobs": {"url": "http://127.0.0.1:9/x"}}},
    ("POST", "/v1/mcp/grants"): {"server": "walked", "user": "bob"},
    ("POST", "/v1/mcp/requests/{request_id}/review"): {"decision": "approve"},
    ("POST", "/v1/mcp/servers/{name}/login"): {},
    ("POST", "/v1/mcp/login"): {"state": "s", "code": "c"},
    ("PUT", "/v1/custom-tools"): {**TOOL, "description": "bob's now"},
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    ROOT.mkdir(parents=True, exist_ok=True)
    yield from start_cluster(
        groups=("fs", "runtime"),
        approval_timeout_s=600,
        workspace_root=str(ROOT),
        user_ceilings={},
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


def client(api: str, key: str | None, **headers: str) -> httpx.Client:
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.Client(base_url=api, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def alices(cluster: Cluster, api: str, keys: dict[str, str]) -> dict[str, str]:
    """Alice's objects, and the admin's: a job parked on an approval (its session), an
    artifact and a canvas version of that session; an MCP server, a grant, an access
    request and a custom tool."""
    with client(api, keys["alice"]) as alice, client(api, keys["admin"]) as admin:
        job = alice.post(
            "/v1/jobs",
            json={
                "prompt": "make a file",
                "script": script(
                    {"tool_calls": [call("t", "exec", command="touch approved")]},
                    {"text": "made"},
                ),
            },
        )
        assert job.status_code == 201, job.text
        job_id = job.json()["job_id"]
        assert admin.put("/v1/custom-tools", json=TOOL).status_code == 201
        assert admin.post("/v1/mcp/servers", json=SERVER).status_code == 201
        granted = admin.post("/v1/mcp/grants", json={"server": "walked", "user": "alice"})
        assert granted.status_code == 201, granted.text
        asked = alice.post("/v1/mcp/requests", json={"server": "walked", "reason": "pls"})
        assert asked.status_code == 201, asked.text
    asked_for = wait_until(lambda: _approval(cluster, job_id), what="alice's approval")
    art = ArtifactStore(cluster.client.store.conn, cluster.iso.settings).put(
        b"alice's bytes", "text/plain", user_id="alice", session_id=job_id, job_id=job_id
    )
    cluster.client.store.conn.execute(
        "INSERT INTO canvas_versions (session_id, version, format, content, html)"
        " VALUES (%s, 1, 'html', %s, %s)",
        (job_id, "<p>alice</p>", "<p>alice</p>"),
    )
    return {
        "job_id": job_id,
        "session_id": job_id,
        "request_id": asked_for,
        "artifact_id": art.id,
        "name": "walked",
        "server": "walked",
        "mcp_request_id": asked.json()["id"],
    }


def _approval(cluster: Cluster, job_id: str) -> str | None:
    raw: Any = cluster.client.redis.xrange(broker_keys.events(job_id))
    for _, fields in raw:
        event = Event.model_validate_json(fields[b"e"])
        if event.type == "approval_requested":
            return str(event.data["request_id"])
    return None


def openapi_routes(api: str) -> set[tuple[str, str]]:
    document = httpx.get(f"{api}/openapi.json", timeout=10).json()
    return {(m.upper(), p) for p, methods in document["paths"].items() for m in methods}


def fill(path: str, ids: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "request_id" and "/mcp/" in path:
            return ids["mcp_request_id"]
        return ids[name]

    return re.sub(r"\{(\w+)\}", one, path)


def state(cluster: Cluster, job_id: str) -> str:
    """A digest of everything a request could change: every table of the schema (a key's
    `last_used_at` and a job's lease aside) and the job's Redis control keys."""
    conn = cluster.client.store.conn
    tables = [
        r["table_name"]
        for r in conn.execute(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = current_schema() ORDER BY table_name"
        ).fetchall()
    ]
    digest = hashlib.sha256()
    for table in tables:
        columns = {
            "api_keys": "id, user_id, admin, agents, revoked_at",
            "jobs": "id, status, spec, iterations",
        }.get(table, "*")
        rows = conn.execute(f"SELECT {columns} FROM {table}").fetchall()
        digest.update(table.encode())
        digest.update(json.dumps(sorted(map(str, rows))).encode())
    r = cluster.client.redis
    for key in (broker_keys.cancel(job_id), broker_keys.steer(job_id)):
        digest.update(repr(r.dump(key)).encode())
    return digest.hexdigest()


def test_every_route_is_classified(api: str) -> None:
    assert openapi_routes(api) == set(ROUTES), "classify the new route in ROUTES"


def test_another_users_objects_are_404_and_admin_routes_403_and_nothing_changes(
    cluster: Cluster, api: str, keys: dict[str, str], alices: dict[str, str]
) -> None:
    before = state(cluster, alices["job_id"])
    walked = {"object": 0, "admin": 0}
    with client(api, keys["bob"]) as bob:
        for (method, path), kind in ROUTES.items():
            if kind not in walked:
                continue
            response = bob.request(method, fill(path, alices), json=BODIES.get((method, path)))
            expected = 404 if kind == "object" else 403
            assert response.status_code == expected, (method, path, response.text)
            assert set(response.json()) == {"error"}, response.text
            walked[kind] += 1
    assert walked == {"object": 16, "admin": 17}
    assert state(cluster, alices["job_id"]) == before
    # and what bob tried had no effect later: alice's job goes on as hers alone
    with client(api, keys["alice"]) as alice:
        answered = alice.post(
            f"/v1/jobs/{alices['job_id']}/approvals/{alices['request_id']}",
            json={"decision": "allow-once"},
        )
        assert answered.status_code == 204, answered.text
        result = cluster.client.job(alices["job_id"]).wait(timeout=60)
    assert result.status == "completed" and result.final_text == "made", result
    transcript = json.dumps(cluster.client.store.transcript(alices["session_id"], 100))
    assert "bob was here" not in transcript


def test_the_admin_reaches_every_object_route(
    cluster: Cluster, api: str, keys: dict[str, str], alices: dict[str, str]
) -> None:
    """The other side of the walk: the objects exist, so bob's 404 was about their owner."""
    with client(api, keys["admin"]) as admin:
        for (method, path), kind in ROUTES.items():
            # a diff is a replay's (alice's job is none: test_replay_e2e reaches one)
            if kind == "object" and method == "GET" and not path.endswith(("events", "diff")):
                response = admin.get(fill(path, alices))
                assert response.status_code == 200, (path, response.text)
        shown = admin.get(f"/v1/custom-tools/{alices['name']}")
        assert shown.json()["description"] == "Does nothing"  # bob's PUT changed nothing


def test_a_user_acts_for_nobody_else_on_the_open_routes(
    api: str, keys: dict[str, str], alices: dict[str, str]
) -> None:
    with client(api, keys["bob"]) as bob:
        for_alice = bob.post("/v1/mcp/requests", json={"server": "walked", "user": "alice"})
        assert for_alice.status_code == 403, for_alice.text
        as_agent = bob.post("/v1/mcp/requests", json={"server": "walked", "agent": "main"})
        assert as_agent.status_code == 403, as_agent.text
        elsewhere = bob.post(
            "/v1/jobs",
            json={"prompt": "x", "workspace": str(ROOT / "alice"), "script": script({"text": "t"})},
        )
        assert elsewhere.status_code == 403, elsewhere.text


@pytest.mark.parametrize(
    "presented",
    [None, "Basic dXNlcjpwYXNz", "not-a-key", "UNKNOWN", "REVOKED", "WRONG-SECRET"],
    ids=["none", "other-scheme", "malformed", "unknown", "revoked", "real-id-wrong-secret"],
)
def test_every_v1_route_refuses_a_missing_or_bad_key(
    cluster: Cluster, api: str, keys: dict[str, str], alices: dict[str, str], presented: str | None
) -> None:
    store = ApiKeyStore(cluster.client.store)
    alice_id = keys["alice"].split("_")[1]
    headers: dict[str, str] = {}
    if presented == "Basic dXNlcjpwYXNz":
        headers, presented = {"Authorization": presented}, None
    elif presented == "UNKNOWN":
        presented = f"clawq_{uuid.uuid4().hex[:12]}_{'x' * 43}"
    elif presented == "REVOKED":
        revoked, presented = store.create("carol")
        store.revoke(revoked.id)
    elif presented == "WRONG-SECRET":
        presented = f"clawq_{alice_id}_{'y' * 43}"
    used = {k.id: k.last_used_at for k in store.list()}
    count = 0
    with client(api, presented, **headers) as anyone:
        for method, path in ROUTES:
            if not path.startswith("/v1/"):
                continue
            response = anyone.request(method, fill(path, alices), json=BODIES.get((method, path)))
            assert response.status_code == 401, (method, path, response.text)
            assert response.json()["error"]["code"] == "unauthorized"
            count += 1
    assert count == 38
    assert {k.id: k.last_used_at for k in store.list()} == used  # no key was marked used


@pytest.mark.parametrize("bad", ["a\x00b", "a\nb", "x" * 300], ids=["nul", "newline", "long"])
def test_a_malformed_id_is_404_on_every_route_that_takes_one(
    api: str, keys: dict[str, str], alices: dict[str, str], bad: str
) -> None:
    count = 0
    for who in ("alice", "admin"):
        with client(api, keys[who]) as caller:
            for (method, path), kind in ROUTES.items():
                if "{" not in path or (who == "alice" and kind == "admin"):
                    continue
                ids = {k: quote(bad, safe="") for k in alices}  # sent as %00, %0A
                response = caller.request(method, fill(path, ids), json=BODIES.get((method, path)))
                assert response.status_code == 404, (who, method, path, response.text)
                assert response.json()["error"]["code"] == "not_found"
                count += 1
    assert count == 18 + 26  # alice: her object routes and the public ones; the admin: all


def test_a_malformed_resume_point_is_refused_before_the_stream(
    api: str, keys: dict[str, str], alices: dict[str, str]
) -> None:
    with client(api, keys["alice"]) as alice:
        path = f"/v1/jobs/{alices['job_id']}/events"
        garbage = alice.get(path, params={"after": "garbage"})
        assert garbage.status_code == 422 and garbage.json()["error"]["field"] == "after"
        header = alice.get(path, headers={"Last-Event-ID": "x\ty"})
        assert header.status_code == 422, header.text
