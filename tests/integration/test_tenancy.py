"""Tenancy end to end (issue 26): two users, alice and bob, and an admin, over the real
HTTP API against a real cluster. A user's job gains no rights: no administration, no
workspace outside the user's roots, no rule beyond the user's ceiling, no other user's
session, grant or agent."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.config.live import TOPIC, LiveConfigStore
from broker.protocol import AGENT_RUN_TASK, AGENTS_QUEUE, JobSpec
from broker.redis import changes
from broker.stores.api_keys import ApiKeyStore
from orchestrator.client import Job
from tests.integration.conftest import Cluster, call, script, serve_api, start_cluster

ROOT = Path(os.environ.get("TMPDIR", "/tmp")) / f"clawq-tenancy-{os.getpid()}"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    ROOT.mkdir(parents=True, exist_ok=True)
    yield from start_cluster(
        groups=("fs", "runtime", "sessions", "automation"),
        approval_timeout_s=20,
        workspace_root=str(ROOT),
        user_ceilings={},  # the default ceiling for everyone: roots under ROOT/<user> only
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
        "coder": store.create("bob", agents=("main", "coder"))[1],
        "admin": store.create("root", admin=True)[1],
    }


@pytest.fixture
def http(api: str, keys: dict[str, str]) -> Iterator[dict[str, httpx.Client]]:
    clients = {
        who: httpx.Client(base_url=api, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        for who, key in keys.items()
    }
    yield clients
    for client in clients.values():
        client.close()


def submit(client: httpx.Client, *turns: dict[str, Any], **body: Any) -> str:
    response = client.post("/v1/jobs", json={"prompt": "go", "script": script(*turns), **body})
    assert response.status_code == 201, response.text
    return str(response.json()["job_id"])


def finished(cluster: Cluster, job_id: str) -> Any:
    return cluster.client.job(job_id).wait(timeout=60)


def approval(cluster: Cluster, job_id: str) -> str:
    event = next(e for e in Job(cluster.client, job_id).events() if e.type == "approval_requested")
    return str(event.data["request_id"])


def config_versions(cluster: Cluster) -> int:
    return len(LiveConfigStore(cluster.client.store.conn).history())


# -- 1: administration is people only ---------------------------------------------------


def hook_config(marker: Path) -> dict[str, Any]:
    hook = {"matcher": "*", "hooks": [{"command": f"{sys.executable} -c \"open('{marker}','w')\""}]}
    return {"hooks": {"PreToolUse": [hook]}}


@pytest.mark.parametrize(
    "args",
    [
        {"action": "config.apply", "config": "HOOKS"},
        {"action": "config.apply", "config": {"user_permissions": {"alice": {"deny": ["exec"]}}}},
        {"action": "config.apply", "config": {"tool_policy": {"deny": ["read_file"]}}},
        {"action": "config.rollback"},
        {"action": "workers", "op": "cancel_consumer", "queue": "fs"},
    ],
    ids=["hooks", "user_permissions", "tool_policy", "rollback", "queues"],
)
def test_a_users_job_never_administers_the_cluster(
    cluster: Cluster, http: dict[str, httpx.Client], tmp_path: Path, args: dict[str, Any]
) -> None:
    marker = tmp_path / "hooked"
    if args.get("config") == "HOOKS":
        args = {**args, "config": hook_config(marker)}
    before = config_versions(cluster)
    job = submit(
        http["bob"],
        {"tool_calls": [call("g", "gateway", **args)]},
        {"text": "done"},
        allow=["gateway"],
    )
    (made,) = finished(cluster, job).tool_calls
    assert made.is_error and made.decision == "deny:tenancy", made
    assert "only a job submitted with an admin's key" in made.output
    assert config_versions(cluster) == before
    alice = submit(http["alice"], {"tool_calls": [call("l", "list_files")]}, {"text": "ok"})
    assert finished(cluster, alice).status == "completed"
    assert not marker.exists()
    ping = submit(
        http["alice"], {"tool_calls": [call("p", "gateway", action="workers")]}, {"text": "ok"}
    )
    (answered,) = finished(cluster, ping).tool_calls
    assert not answered.is_error and "workers answered" in answered.output  # agents may read


def test_bypass_permissions_is_refused_unless_an_admin_granted_it(
    http: dict[str, httpx.Client],
) -> None:
    refused = http["bob"].post(
        "/v1/jobs",
        json={"prompt": "go", "permission_mode": "bypassPermissions", "script": script({})},
    )
    assert refused.status_code == 403
    assert refused.json()["error"]["field"] == "the default ceiling.modes"


def test_administration_in_an_admins_job_needs_an_admins_approval(
    cluster: Cluster, http: dict[str, httpx.Client], tmp_path: Path
) -> None:
    apply = {"action": "config.apply", "config": {"approval_timeout_s": 19}}
    before = config_versions(cluster)
    job = submit(
        http["admin"],
        {"tool_calls": [call("g", "gateway", **apply)]},
        {"text": "done"},
        allow=["gateway"],
        permission_mode="bypassPermissions",
        workspace=str(tmp_path),
    )
    request = approval(cluster, job)  # neither the allow rule nor bypass lets it run
    cluster.client.job(job).approve(request, "allow-always", by="bob", admin=False)
    (refused,) = finished(cluster, job).tool_calls
    assert refused.decision == "deny:tenancy" and "needs an admin" in refused.output
    assert config_versions(cluster) == before
    again = submit(
        http["admin"],
        {"tool_calls": [call("g", "gateway", **apply)]},
        {"text": "done"},
        allow=["gateway"],
        workspace=str(tmp_path),
    )
    answered = http["admin"].post(
        f"/v1/jobs/{again}/approvals/{approval(cluster, again)}", json={"decision": "allow-once"}
    )
    assert answered.status_code == 204
    (applied,) = finished(cluster, again).tool_calls
    assert not applied.is_error and applied.output.startswith("applied version"), applied
    assert config_versions(cluster) == before + 1
    rollback = submit(
        http["admin"],
        {"tool_calls": [call("r", "gateway", action="config.rollback")]},
        {"text": "ok"},
        allow=["gateway"],
        workspace=str(tmp_path),
    )
    cluster.client.job(rollback).approve(approval(cluster, rollback), "allow-once")
    assert not finished(cluster, rollback).tool_calls[0].is_error


# -- 2 and 3: workspaces under the user's roots, rules within the ceiling -------------------


def test_a_workspace_outside_the_users_roots_is_refused(http: dict[str, httpx.Client]) -> None:
    alice_home = ROOT / "alice"
    alice_home.mkdir(parents=True, exist_ok=True)
    (alice_home / "secret.txt").write_text("alice's secret\n")
    (ROOT / "bob").mkdir(parents=True, exist_ok=True)
    link = ROOT / "bob" / "hers"
    if not link.is_symlink():
        link.symlink_to(alice_home)
    for workspace in (str(alice_home), "/etc", "../alice", "hers", str(link)):
        refused = http["bob"].post(
            "/v1/jobs",
            json={
                "prompt": "read it",
                "workspace": workspace,
                "script": script({"tool_calls": [call("r", "read_file", path="secret.txt")]}),
            },
        )
        assert refused.status_code == 403, (workspace, refused.text)
        assert refused.json()["error"]["field"] == "the default ceiling.workspace_roots"
    assert (alice_home / "secret.txt").read_text() == "alice's secret\n"


def test_a_job_with_no_workspace_works_in_the_users_own_root(
    cluster: Cluster, http: dict[str, httpx.Client]
) -> None:
    job = submit(
        http["bob"],
        {"tool_calls": [call("w", "write_file", path="mine.txt", content="b")]},
        {"text": "ok"},
        allow=["write_file"],
    )
    assert finished(cluster, job).status == "completed"
    assert (ROOT / "bob" / "mine.txt").read_text() == "b"


def test_the_network_rule_is_an_admins_grant(
    cluster: Cluster, http: dict[str, httpx.Client]
) -> None:
    refused = http["bob"].post(
        "/v1/jobs", json={"prompt": "go", "allow": ["exec", "network"], "script": script({})}
    )
    assert refused.status_code == 403
    assert refused.json()["error"]["field"] == "the default ceiling.network"
    assert "the allow rule network is beyond" in refused.json()["error"]["message"]


def test_a_ceiling_applied_live_binds_the_next_submit(
    cluster: Cluster, http: dict[str, httpx.Client]
) -> None:
    store = LiveConfigStore(cluster.client.store.conn)
    current = store.current()
    applied = current.config if current else {}
    ceiling = {"user_ceilings": {"bob": {"allow": ["read_file"]}}}
    store.apply(cluster.client.settings, {**applied, **ceiling}, "test")
    changes.announce(cluster.client.redis, TOPIC)
    try:
        refused = http["bob"].post(
            "/v1/jobs", json={"prompt": "go", "allow": ["exec"], "script": script({})}
        )
        assert refused.status_code == 403
        assert refused.json()["error"]["field"] == "user_ceilings.bob.allow"
        within = http["bob"].post(
            "/v1/jobs", json={"prompt": "go", "allow": ["Read"], "script": script({"text": "ok"})}
        )
        assert within.status_code == 201
    finally:
        store.rollback("test")
        changes.announce(cluster.client.redis, TOPIC)


def test_a_stored_job_beyond_the_ceiling_fails_as_it_starts(cluster: Cluster) -> None:
    """Every way a job is made passes the orchestrator: a user's spec stored beyond the
    user's ceiling (a stale cron entry, a forged queue message) never runs a turn."""
    job_id = uuid.uuid4().hex
    spec = JobSpec(
        prompt="go",
        workspace="/etc",
        allow=["network"],
        user_id="bob",
        script=script({"tool_calls": [call("r", "read_file", path="hostname")]}),
    )
    cluster.client.store.create_job(job_id, session_id=job_id, spec=spec, user_id="bob")
    cluster.client.app.send_task(
        AGENT_RUN_TASK, kwargs={"job_id": job_id}, queue=AGENTS_QUEUE, task_id=job_id
    )
    outcome = cluster.client.job(job_id).wait(timeout=60)
    assert outcome.status == "failed" and "the default ceiling.network" in outcome.error
    assert outcome.tool_calls == []


# -- 4, 5, 8: owners everywhere --------------------------------------------------------------


def test_sessions_history_of_another_users_session_is_not_found(
    cluster: Cluster, http: dict[str, httpx.Client]
) -> None:
    hers = submit(http["alice"], {"text": "ALICE-PRIVATE-TEXT"})
    assert finished(cluster, hers).status == "completed"
    job = submit(
        http["bob"], {"tool_calls": [call("h", "sessions_history", session_id=hers)]}, {"text": "x"}
    )
    (read,) = finished(cluster, job).tool_calls
    assert read.is_error and read.output == f"no session {hers}"
    own = submit(
        http["alice"],
        {"tool_calls": [call("h", "sessions_history", session_id=hers)]},
        {"text": "ok"},
    )
    (mine,) = finished(cluster, own).tool_calls
    assert "ALICE-PRIVATE-TEXT" in mine.output  # the owner still reads it


def test_allow_always_is_one_users_grant_to_one_agent(
    cluster: Cluster, http: dict[str, httpx.Client]
) -> None:
    command = f"echo GRANT-{time.time_ns()}"
    turns = ({"tool_calls": [call("x", "exec", command=command)]}, {"text": "done"})
    bobs = submit(http["bob"], *turns)
    answered = http["bob"].post(
        f"/v1/jobs/{bobs}/approvals/{approval(cluster, bobs)}", json={"decision": "allow-always"}
    )
    assert answered.status_code == 204
    assert finished(cluster, bobs).tool_calls[0].decision == "allow:approval"
    again = submit(http["bob"], *turns)
    assert finished(cluster, again).tool_calls[0].decision == "allow:grant"  # his own: kept
    alices = submit(http["alice"], *turns)
    request = approval(cluster, alices)  # she is asked: bob's answer is not hers
    http["alice"].post(f"/v1/jobs/{alices}/approvals/{request}", json={"decision": "deny"})
    (hers,) = finished(cluster, alices).tool_calls
    assert hers.decision == "deny:approval" and hers.is_error


def test_a_key_runs_only_the_agents_it_names_and_claims_no_channel(
    cluster: Cluster, http: dict[str, httpx.Client]
) -> None:
    body = {"prompt": "go", "script": script({"text": "hi"})}
    refused = http["bob"].post("/v1/jobs", json={**body, "agent": "coder"})
    assert refused.status_code == 404 and refused.json()["error"]["message"] == "no agent coder"
    allowed = http["coder"].post("/v1/jobs", json={**body, "agent": "coder"})
    assert allowed.status_code == 201
    assert cluster.client.store.job(allowed.json()["job_id"])["spec"]["agent_id"] == "coder"
    for origin in ({"channel": "telegram", "chat_id": "42"}, {"chat_id": "42"}):
        claimed = http["bob"].post("/v1/jobs", json={**body, **origin})
        assert claimed.status_code == 403 and claimed.json()["error"]["field"] == "channel"
    admin = http["admin"].post("/v1/jobs", json={**body, "channel": "telegram", "chat_id": "42"})
    assert admin.status_code == 201


def test_the_keys_cli_names_the_agents(cluster: Cluster) -> None:
    import subprocess

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "keys",
            "create",
            "--user",
            "carol",
            "--agent",
            "main",
            "--agent",
            "coder",
        ],
        env={**os.environ, **cluster.env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.startswith("clawq_") and "agents coder, main" in out.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "keys", "list", "--json"],
        env={**os.environ, **cluster.env},
        capture_output=True,
        text=True,
        check=True,
    )
    carol = next(k for k in json.loads(listed.stdout) if k["user_id"] == "carol")
    assert carol["agents"] == ["coder", "main"]
    bad = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "keys", "create", "--user", "../x"],
        env={**os.environ, **cluster.env},
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "is not a user id" in bad.stderr
