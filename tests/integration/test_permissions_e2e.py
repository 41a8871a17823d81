"""Every layer of the dispatch pipeline, end to end with real workers: a refused call never
reaches a worker (no ledger entry, no effect) and the model gets a clear error result."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from broker.redis.presence import live_processes
from orchestrator.client import Job
from tests.integration.conftest import Cluster, call, script, start_cluster, wait_until

HOOK = Path(__file__).resolve().parent.parent / "fixtures" / "hooks" / "deny_forbidden.py"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(
        approval_timeout_s=3,
        rate_limit_per_hour=4,
        tool_policy={"deny": ["glob"]},
        permissions={"deny": ["exec(curl *)"]},
        hooks={
            "PreToolUse": [{"matcher": "Bash", "hooks": [{"command": f"{sys.executable} {HOOK}"}]}]
        },
    )


def calls(*items: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    """A one-turn script of these calls, then an answer."""
    return script({"tool_calls": [call(i, n, **a) for i, n, a in items]}, {"text": "done"})


def reached_worker(cluster: Cluster, job: Job) -> set[str]:
    """Call ids a worker began, read from the workers' own ledger entries."""
    with redis.Redis.from_url(cluster.iso.redis_url) as client:
        return {k.decode().rsplit(":", 1)[1] for k in client.scan_iter(f"clawq:call:{job.id}:*")}


def denials(job: Job) -> dict[str, dict[str, Any]]:
    return {e.data["call_id"]: e.data for e in job.events() if e.type == "tool_call_denied"}


def test_each_layer_refuses_before_any_worker(cluster: Cluster, workspace: Path) -> None:
    (workspace / "secrets").mkdir()
    (workspace / "secrets" / "key.txt").write_text("TOP SECRET\n")
    (workspace / "public.txt").write_text("SECRET-free notes\n")
    job = cluster.client.submit(
        "probe",
        workspace=str(workspace),
        allow=["exec"],
        deny=["read_file(./secrets/**)"],
        script=calls(
            ("policy", "glob", {"pattern": "*"}),
            ("managed", "exec", {"command": "curl http://example.com -o page.html"}),
            ("job_rule", "read_file", {"path": "secrets/key.txt"}),
            ("hook", "exec", {"command": "echo forbidden > hooked.txt"}),
            ("walk", "search", {"pattern": "SECRET"}),
            ("ok", "exec", {"command": "echo fine > fine.txt"}),
        ),
    )
    result = job.wait(timeout=60)
    by_id = {c.id: c for c in result.tool_calls}
    denied = denials(job)
    assert {k: v["layer"] for k, v in denied.items()} == {
        "policy": "policy",
        "managed": "rule",
        "job_rule": "rule",
        "hook": "hook",
    }
    assert "not available" in by_id["policy"].output
    assert "exec(curl *)" in by_id["managed"].output
    assert "read_file(./secrets/**)" in by_id["job_rule"].output
    assert "blocked by the audit hook" in by_id["hook"].output
    assert all(by_id[c].is_error for c in denied)
    assert reached_worker(cluster, job) == {"walk", "ok"}
    assert not (workspace / "page.html").exists() and not (workspace / "hooked.txt").exists()
    assert by_id["walk"].output == "public.txt:1: SECRET-free notes"  # secrets/ is hidden
    assert (workspace / "fine.txt").read_text() == "fine\n"
    assert by_id["ok"].decision == "allow:rule" and "exec" in by_id["ok"].decided_by


def test_plan_mode_and_rate_limit(cluster: Cluster, workspace: Path) -> None:
    plan = cluster.client.submit(
        "plan",
        workspace=str(workspace),
        permission_mode="plan",
        script=calls(
            ("w", "write_file", {"path": "x.txt", "content": "x"}), ("r", "list_files", {})
        ),
    )
    result = plan.wait(timeout=60)
    write, listing = result.tool_calls
    assert write.is_error and "plan mode" in write.output and not listing.is_error
    assert reached_worker(cluster, plan) == {"r"} and not (workspace / "x.txt").exists()

    many = cluster.client.submit(
        "many",
        workspace=str(workspace),
        script=calls(*[(f"l{i}", "list_files", {}) for i in range(5)]),
    )
    result = many.wait(timeout=60)
    assert [c.is_error for c in result.tool_calls] == [False] * 4 + [True]
    assert "rate limit" in result.tool_calls[4].output
    assert denials(many)["l4"]["layer"] == "rate_limit"
    assert "l4" not in reached_worker(cluster, many)


def answer_next(job: Job, decision: str) -> str:
    for event in job.events():
        if event.type == "approval_requested":
            job.approve(event.data["request_id"], decision, by="alice")
            return str(event.data["request_id"])
    raise AssertionError("no approval was requested")


def test_approval_deny_allow_once_and_timeout(cluster: Cluster, workspace: Path) -> None:
    denied = cluster.client.submit(
        "x", workspace=str(workspace), script=calls(("e", "exec", {"command": "touch no"}))
    )
    answer_next(denied, "deny")
    (call,) = denied.wait(timeout=60).tool_calls
    assert call.is_error and "alice denied exec" in call.output
    assert reached_worker(cluster, denied) == set() and not (workspace / "no").exists()

    once = cluster.client.submit(
        "x", workspace=str(workspace), script=calls(("e", "exec", {"command": "touch yes"}))
    )
    request_id = answer_next(once, "allow-once")
    (call,) = once.wait(timeout=60).tool_calls
    assert not call.is_error and (workspace / "yes").exists()
    assert call.decision == "allow:approval" and call.decided_by == "user alice"
    row = cluster.client.store.approval(request_id)
    assert row is not None and (row["status"], row["answered_by"]) == ("allow-once", "alice")
    with pytest.raises(Exception, match="already allow-once"):
        once.approve(request_id, "deny")

    protected = cluster.client.submit(
        "x",
        workspace=str(workspace),
        allow=["write_file(.git/**)"],
        script=calls(("g", "write_file", {"path": ".git/config", "content": "evil"})),
    )
    (call,) = protected.wait(timeout=60).tool_calls
    assert call.is_error and "not approved within 3s" in call.output
    assert "protected path" in call.output and not (workspace / ".git" / "config").exists()


def test_hook_rewrites_are_validated_and_results_are_scrubbed(
    cluster: Cluster, workspace: Path
) -> None:
    job = cluster.client.submit(
        "x",
        workspace=str(workspace),
        allow=["exec"],
        script=calls(
            ("rewrite", "exec", {"command": "echo rewrite-me > original.txt"}),
            ("broken", "exec", {"command": "echo break-me"}),
            ("secret", "exec", {"command": "echo api_key=abcd1234efgh5678 sk-" + "x" * 24}),
        ),
    )
    by_id = {c.id: c for c in job.wait(timeout=60).tool_calls}
    assert (workspace / "rewritten.txt").read_text() == "rewritten\n"
    assert not (workspace / "original.txt").exists()
    assert by_id["broken"].is_error and "rewrote the input badly" in by_id["broken"].output
    assert reached_worker(cluster, job) == {"rewrite", "secret"}
    secret = by_id["secret"].output
    assert "abcd1234efgh5678" not in secret and "x" * 24 not in secret
    assert secret.startswith("api_key=[REDACTED] [REDACTED]")


def test_allow_always_holds_on_another_orchestrator(cluster: Cluster, workspace: Path) -> None:
    """Last in this module: it stops the cluster's orchestrator."""

    def ran_on(job: Job) -> str:
        row = cluster.client.store.conn.execute(
            "SELECT orchestrator FROM jobs WHERE id = %s", (job.id,)
        ).fetchone()
        assert row is not None
        return str(row["orchestrator"])

    first = cluster.client.submit(
        "x",
        workspace=str(workspace),
        script=calls(("e", "exec", {"command": "echo one >> log.txt"})),
    )
    answer_next(first, "allow-always")
    assert not first.wait(timeout=60).tool_calls[0].is_error
    stack_orchestrator = cluster.stack.procs[0]
    assert ran_on(first).endswith(f":{stack_orchestrator.pid}")
    env = {**os.environ, **cluster.env}
    second = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "orchestrator", "--log-level", "warning"],
        env=env,
    )
    try:
        with redis.Redis.from_url(cluster.iso.redis_url) as client:
            wait_until(
                lambda: any(p["pid"] == second.pid for p in live_processes(client)),
                what="the second orchestrator's heartbeat",
            )
        stack_orchestrator.send_signal(signal.SIGTERM)  # only the second one is left
        stack_orchestrator.wait(30)
        later = cluster.client.submit(
            "x",
            workspace=str(workspace),
            script=calls(("e", "exec", {"command": "echo one >> log.txt"})),
        )
        (call,) = later.wait(timeout=60).tool_calls
        assert ran_on(later).endswith(f":{second.pid}")  # not the one that was asked
        assert not call.is_error and call.decision == "allow:grant"
        assert not any(e.type == "approval_requested" for e in later.events())
        assert (workspace / "log.txt").read_text() == "one\none\n"
    finally:
        second.terminate()
        second.wait(15)
