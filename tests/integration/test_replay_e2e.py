"""Replays of a recorded job on a real cluster: calls answered from the ledger run nothing
(counted by their own side effects: the lines a command appends, the files' mtimes), and a
changed script's divergence is named, its write blocked or kept to a sandbox."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Cluster, call, script, serve_api, start_cluster

USAGE = {"input": 120, "output": 30}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(model_prices={"scripted": [1.0, 2.0]})


def turn_of(i: int) -> dict[str, Any]:
    """Turn i (0-based) of the recorded job: writes, commands that append, reads, edits."""
    kind = i % 4
    if kind == 0:
        calls = [call(f"w{i}", "write_file", path=f"f{i}.txt", content=f"version {i}\n")]
    elif kind == 1:
        calls = [call(f"x{i}", "exec", command=f"echo s{i} >> effects.txt")]
    elif kind == 2:
        calls = [
            call(f"r{i}", "read_file", path="effects.txt"),
            call(f"l{i}", "list_files"),
        ]
    else:
        calls = [
            call(f"e{i}", "edit_file", path=f"f{i - 3}.txt", old_string="version", new_string="v")
        ]
    return {"text": f"step {i + 1}", "tool_calls": calls, "usage": USAGE}


TURNS = [turn_of(i) for i in range(19)] + [{"text": "all done", "usage": USAGE}]


def changed_at_10() -> dict[str, Any]:
    """The same script but turn 10: a new write (an effect) and a new read."""
    turns = [dict(t) for t in TURNS]
    turns[9] = {
        "text": "another way",
        "tool_calls": [
            call("n9", "write_file", path="new.txt", content="diverged\n"),
            call("q9", "read_file", path="f0.txt"),
        ],
        "usage": USAGE,
    }
    return script(*turns)


def snapshot(ws: Path) -> dict[str, int]:
    return {str(p.relative_to(ws)): p.stat().st_mtime_ns for p in ws.rglob("*") if p.is_file()}


def own_messages(cluster: Cluster, job_id: str) -> list[tuple[str, Any]]:
    rows = cluster.client.store.conn.execute(
        "SELECT role, content FROM messages WHERE job_id = %s ORDER BY seq", (job_id,)
    ).fetchall()
    return [(r["role"], r["content"]) for r in rows]


@pytest.fixture(scope="module")
def recorded(cluster: Cluster) -> tuple[str, Path]:
    ws = Path(tempfile.mkdtemp(prefix="replay-ws-"))
    job = cluster.client.submit("do twenty things", workspace=str(ws), allow=["exec"],
                                script=script(*TURNS))  # fmt: skip
    result = job.wait(timeout=120)
    assert result.status == "completed" and result.iterations == 20
    assert (ws / "effects.txt").read_text().count("\n") == 5  # turns 2, 6, 10, 14, 18
    return job.id, ws


def test_a_replay_with_the_same_script_is_identical_and_runs_no_tool(
    cluster: Cluster, recorded: tuple[str, Path]
) -> None:
    original, ws = recorded
    before = snapshot(ws)
    effects = (ws / "effects.txt").read_text()
    job = cluster.client.replay(original)
    result = job.wait(timeout=120)
    assert result.status == "completed" and result.final_text == "all done"
    # the same transcript, message for message
    assert own_messages(cluster, job.id) == own_messages(cluster, original)
    assert len(own_messages(cluster, job.id)) == 1 + 20 + 19
    # zero tools ran: no command appended, no file was touched, nothing was queued
    assert (ws / "effects.txt").read_text() == effects
    assert snapshot(ws) == before
    assert not [e for e in job.events() if e.type == "tool_call_queued"]
    assert {c.worker for c in result.tool_calls} == {"ledger"}
    row = cluster.client.store.conn.execute(
        "SELECT replay_of FROM jobs WHERE id = %s", (job.id,)
    ).fetchone()
    assert row is not None and row["replay_of"] == original
    diff = cluster.client.replay_diff(job.id)
    assert diff.identical and diff.diverged_at is None
    assert diff.tools_run == 0 and diff.sources == {"ledger": 24}
    assert diff.tokens.same and diff.tokens.replay == 20 * 150
    assert diff.cost_usd.same and diff.cost_usd.replay > 0


def test_a_script_that_diverges_at_turn_10_has_its_write_blocked(
    cluster: Cluster, recorded: tuple[str, Path]
) -> None:
    original, ws = recorded
    before = snapshot(ws)
    job = cluster.client.replay(original, script=changed_at_10())
    result = job.wait(timeout=120)
    assert result.status == "completed"
    assert not (ws / "new.txt").exists() and snapshot(ws) == before
    diff = cluster.client.replay_diff(job.id)
    assert not diff.identical and diff.diverged_at == 10
    assert all(t.same for t in diff.turns[:9]) and not diff.turns[9].same
    early = [c for c in diff.calls if c.turn < 10 and c.source != "not made"]
    assert early and {c.source for c in early} == {"ledger"}
    at_10 = {c.name: c.source for c in diff.calls if c.turn == 10 and c.source != "not made"}
    assert at_10 == {"write_file": "blocked", "read_file": "ran"}
    assert "write_file" in diff.divergence and "blocked" in diff.divergence
    # the original's turn-10 command was never made by the replay
    assert [c.call_id for c in diff.calls if c.source == "not made"] == ["x9"]
    blocked = next(c for c in result.tool_calls if c.id == "n9")
    assert blocked.is_error and "not run in a replay" in blocked.output
    assert diff.tools_run == 1  # the read


def test_with_effects_sandbox_the_divergent_write_lands_in_the_copy_only(
    cluster: Cluster, recorded: tuple[str, Path]
) -> None:
    original, ws = recorded
    before = snapshot(ws)
    job = cluster.client.replay(original, script=changed_at_10(), effects="sandbox")
    result = job.wait(timeout=120)
    assert result.status == "completed"
    assert not (ws / "new.txt").exists() and snapshot(ws) == before
    spec = cluster.client.store.job(job.id)["spec"]  # type: ignore[index]
    sandbox = Path(spec["replay"]["sandbox"])
    assert sandbox != ws and (sandbox / "new.txt").read_text() == "diverged\n"
    assert (sandbox / "f0.txt").read_text() == (ws / "f0.txt").read_text()
    assert oct(os.stat(sandbox).st_mode & 0o777) == "0o700"
    diff = cluster.client.replay_diff(job.id)
    at_10 = {c.name: c.source for c in diff.calls if c.turn == 10 and c.source != "not made"}
    assert at_10 == {"write_file": "sandbox", "read_file": "sandbox"}


def test_a_replay_under_another_policy_shows_the_changed_decisions(
    cluster: Cluster, recorded: tuple[str, Path]
) -> None:
    original, _ = recorded
    job = cluster.client.replay(original, allow=[], deny=["exec"])
    assert job.wait(timeout=120).status == "completed"
    diff = cluster.client.replay_diff(job.id)
    changed = {c.call_id for c in diff.decisions}
    assert changed == {f"x{i}" for i in range(1, 19, 4)}
    assert all(c.decision and c.decision.replay.startswith("deny:") for c in diff.decisions)
    assert diff.sources["refused"] == 5


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Iterator[str]:
    yield from serve_api(cluster)


def test_replay_and_fork_over_the_api_for_the_jobs_owner_only(cluster: Cluster, api: str) -> None:
    from broker.stores.api_keys import ApiKeyStore
    from orchestrator.client import Client, ClientError

    store = ApiKeyStore(cluster.client.store)
    alice = Client(api_url=api, api_key=store.create("alice")[1])
    bob = Client(api_url=api, api_key=store.create("bob")[1])
    try:
        ws = Path(tempfile.mkdtemp(prefix="replay-api-"))
        turns = [
            {"tool_calls": [call("a", "write_file", path="a.txt", content="1")]},
            {"tool_calls": [call("b", "edit_file", path="a.txt", old_string="1", new_string="2")]},
            {"text": "ok"},
        ]
        job = alice.submit("two steps", workspace=str(ws), script=script(*turns))
        assert job.wait(timeout=60).status == "completed"
        replayed = alice.replay(job.id)
        assert replayed.wait(timeout=60).status == "completed"
        diff = alice.replay_diff(replayed.id)
        assert diff.identical and diff.original_id == job.id and diff.sources == {"ledger": 2}
        made = alice.fork(job.id, 1, script=script({"text": "-"}, {"text": "forked"}))
        assert alice.job(made.job_id).wait(timeout=60).final_text == "forked"
        assert Path(made.workspace, "a.txt").read_text() == "1" and made.restored == ["a.txt"]
        assert (ws / "a.txt").read_text() == "2"
        with pytest.raises(ClientError, match="404"):
            bob.replay(job.id)
        with pytest.raises(ClientError, match="404"):
            bob.fork(job.id, 1)
        with pytest.raises(ClientError, match="no replay"):
            alice.replay_diff(job.id)
    finally:
        alice.close()
        bob.close()


def test_clawq_replay_prints_the_diff_as_json_and_as_a_view(
    cluster: Cluster, recorded: tuple[str, Path]
) -> None:
    import json
    import subprocess
    import sys

    original, _ = recorded
    env = {**os.environ, **cluster.env}
    cli = [sys.executable, "-m", "orchestrator.cli", "replay", original]
    out = subprocess.run([*cli, "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    diff = json.loads(out.stdout)
    assert diff["identical"] and diff["original_id"] == original and diff["tools_run"] == 0
    script_file = Path(tempfile.mkdtemp()) / "s.json"
    script_file.write_text(json.dumps(changed_at_10()))
    view = subprocess.run(
        [*cli, "--script", str(script_file), "--check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert view.returncode == 1  # --check: it differs
    assert "diverged at turn 10" in view.stdout and "blocked" in view.stdout
    assert "calls: blocked 1, ledger 23, not made 1, ran 1; tools run: 1" in view.stdout
