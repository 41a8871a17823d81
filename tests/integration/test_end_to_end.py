"""Agent jobs end to end: client → orchestrator → fs/runtime workers → result."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import Cluster, call, script


def test_fs_and_exec_calls_run_on_their_queues_in_different_processes(
    cluster: Cluster, workspace: Path
) -> None:
    job = cluster.client.submit(
        "tidy",
        workspace=str(workspace),
        allow=["exec"],
        script=script(
            {"tool_calls": [call("w", "write_file", path="n.txt", content="a\nb\n")]},
            {"tool_calls": [call("x", "exec", command="wc -l < n.txt")]},
            {"text": "done"},
        ),
    )
    result = job.wait(timeout=60)
    assert result.status == "completed" and result.final_text == "done"
    assert result.iterations == 3
    write, run = result.tool_calls
    assert (write.queue, run.queue) == ("fs", "runtime")
    assert not write.is_error and not run.is_error
    assert run.output.startswith("2\n")
    assert write.worker != run.worker
    assert write.worker.startswith("worker@") and ":" in write.worker


def test_events_are_typed_ordered_and_resumable(cluster: Cluster, workspace: Path) -> None:
    job = cluster.client.submit(
        "list",
        workspace=str(workspace),
        script=script({"tool_calls": [call("l", "list_files")]}, {"text": "ok"}),
    )
    seen = list(job.events())
    types = [e.type for e in seen]
    assert types == [
        "job_queued",
        "job_started",
        "turn_started",
        "tool_call_queued",
        "tool_call_finished",
        "turn_started",
        "model_text",
        "job_finished",
    ]
    assert seen[-1].data["status"] == "completed"
    resumed = list(job.events(after=seen[3].id))
    assert [e.id for e in resumed] == [e.id for e in seen[4:]]


def test_bad_calls_become_error_results_and_the_job_goes_on(
    cluster: Cluster, workspace: Path
) -> None:
    job = cluster.client.submit(
        "try things",
        workspace=str(workspace),
        script=script(
            {
                "tool_calls": [
                    call("u", "no_such_tool"),
                    call("i", "read_file", offset=3),
                    call("e", "exec", command="touch ran"),
                    call("ok", "write_file", path="fine.txt", content="x"),
                ]
            },
            {"text": "recovered"},
        ),
    )
    result = job.wait(timeout=60)
    assert result.status == "completed"
    by_id = {c.id: c for c in result.tool_calls}
    assert by_id["u"].is_error and "Unknown tool" in by_id["u"].output
    assert by_id["i"].is_error and "path" in by_id["i"].output
    assert by_id["e"].is_error and "was not approved within 2s" in by_id["e"].output
    assert not (workspace / "ran").exists()  # exec was never sent to a worker
    assert not by_id["ok"].is_error and (workspace / "fine.txt").read_text() == "x"


def test_running_out_of_turns_fails_clearly(cluster: Cluster, workspace: Path) -> None:
    job = cluster.client.submit(
        "x",
        workspace=str(workspace),
        script=script({"tool_calls": [call("l", "list_files")]}),
    )
    result = job.wait(timeout=60)
    assert result.status == "failed"
    assert "script has 1 turns" in result.error


def test_max_iterations(cluster: Cluster, workspace: Path) -> None:
    looping = script(*[{"tool_calls": [call(f"c{i}", "list_files")]} for i in range(5)])
    job = cluster.client.submit("x", workspace=str(workspace), script=looping, max_iterations=2)
    result = job.wait(timeout=60)
    assert result.status == "max_iterations" and result.iterations == 2


def test_path_escapes_through_the_whole_path(
    cluster: Cluster, workspace: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    (workspace / "out").symlink_to(tmp_path)
    job = cluster.client.submit(
        "escape",
        workspace=str(workspace),
        script=script(
            {
                "tool_calls": [
                    call("r1", "read_file", path="../secret.txt"),
                    call("r2", "read_file", path=str(secret)),
                    call("r3", "read_file", path="out/secret.txt"),
                    call("w1", "write_file", path="out/secret.txt", content="pwned"),
                    call("w2", "write_file", path="../planted.txt", content="pwned"),
                ]
            },
            {"text": "contained"},
        ),
    )
    result = job.wait(timeout=60)
    assert all(c.is_error for c in result.tool_calls)
    assert all("TOP SECRET" not in c.output for c in result.tool_calls)
    assert secret.read_text() == "TOP SECRET"
    assert not (tmp_path / "planted.txt").exists()


def test_cancel_ends_the_job_cancelled(cluster: Cluster, workspace: Path) -> None:
    job = cluster.client.submit(
        "slow",
        workspace=str(workspace),
        allow=["exec"],
        script=script(
            {"tool_calls": [call("s", "exec", command="sleep 2")]},
            {"tool_calls": [call("t", "exec", command="touch second_turn")]},
            {"text": "never"},
        ),
    )
    for event in job.events():
        if event.type == "tool_call_queued":
            job.cancel()
            break
    result = job.wait(timeout=30)
    assert result.status == "cancelled"
    assert not (workspace / "second_turn").exists()


def test_submit_rejects_bad_input_and_queues_nothing(cluster: Cluster, workspace: Path) -> None:
    from orchestrator.client import ClientError

    good = script({"text": "x"})
    bad = [
        ({"prompt": " ", "workspace": str(workspace), "script": good}, "prompt is empty"),
        ({"prompt": "x", "workspace": "relative/ws", "script": good}, "absolute path"),
        ({"prompt": "x", "workspace": str(workspace), "model": "gpt5"}, "unknown model"),
        ({"prompt": "x", "workspace": str(workspace), "script": {"turns": []}}, "invalid script"),
        ({"prompt": "x", "workspace": str(workspace)}, "needs a script"),
    ]
    for kwargs, message in bad:
        prompt = kwargs.pop("prompt")
        with pytest.raises(ClientError, match=message):
            cluster.client.submit(prompt, **kwargs)  # type: ignore[arg-type]
    count = cluster.client.store.conn.execute("SELECT count(*) AS n FROM jobs").fetchone()
    before = count["n"] if count else 0
    cluster.client.submit("ok", workspace=str(workspace), script=good).wait(timeout=30)
    after = cluster.client.store.conn.execute("SELECT count(*) AS n FROM jobs").fetchone()
    assert after is not None and after["n"] == before + 1


def test_dangerous_command_from_the_model_leaves_its_target_untouched(
    cluster: Cluster, workspace: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    job = cluster.client.submit(
        "clean up",
        workspace=str(workspace),
        allow=["exec"],
        permission_mode="bypassPermissions",
        script=script(
            {
                "tool_calls": [
                    call("rm", "exec", command=f"echo cleaning && rm -Rf {victim}"),
                    call("sh", "exec", command=f"env bash -c 'rm --recursive --force {victim}'"),
                ]
            },
            {"text": "done"},
        ),
    )
    result = job.wait(timeout=60)
    assert (victim / "keep.txt").read_text() == "precious"
    for c in result.tool_calls:
        assert c.is_error and c.output.startswith("blocked (destructive file operation): `rm")
    denied = [e.data for e in job.events() if e.type == "tool_call_denied"]
    assert [(d["call_id"], d["layer"]) for d in denied] == [("rm", "tool"), ("sh", "tool")]


def test_the_network_of_a_confined_command_is_the_jobs_to_allow(
    cluster: Cluster, workspace: Path
) -> None:
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    probe = (
        'python3 -c \'import socket; socket.create_connection(("127.0.0.1", '
        f'{port}), timeout=3); print("connected")\''
    )
    try:
        runs = {}
        for allow in (["exec"], ["exec", "network"]):
            job = cluster.client.submit(
                "probe",
                workspace=str(workspace),
                allow=allow,
                script=script({"tool_calls": [call("p", "exec", command=probe)]}, {"text": "ok"}),
            )
            (only,) = job.wait(timeout=60).tool_calls
            runs[len(allow)] = only
    finally:
        server.close()
    assert runs[1].is_error and "connected" not in runs[1].output
    assert not runs[2].is_error and "connected" in runs[2].output


def test_routine_scripts_with_variables_run_and_an_unknown_target_runs_confined(
    cluster: Cluster, workspace: Path
) -> None:
    """Issue 27: 5, through the gate and a real worker: the issue's four scripts run and
    do what they say; a target the line cannot say is not asked (commands run confined
    here), reaches the worker marked so, and changes nothing outside the workspace."""
    import tempfile

    (workspace / "running").mkdir()
    (workspace / "src").mkdir()
    (workspace / "src" / "a.c").write_text("int main;")
    for name in ("one.txt", "two.txt"):
        (workspace / name).write_text(name)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as outside:
        (workspace / "where").write_text(outside)
        lines = {
            "f": "f=running/c1; touch $f",
            "for": 'for f in *.txt; do mv "$f" "${f%.txt}.md"; done',
            "out": 'out=build; mkdir -p "$out" && cp src/*.c "$out"/',
            "name": 'name=report; echo data > "${name}.csv"',
            "unknown": 'd=$(cat where); touch "$d"/made',
        }
        job = cluster.client.submit(
            "routine",
            workspace=str(workspace),
            allow=["exec"],
            script=script(
                {"tool_calls": [call(k, "exec", command=v) for k, v in lines.items()]},
                {"text": "done"},
            ),
        )
        result = job.wait(timeout=60)
        assert not any(e.type == "tool_call_denied" for e in job.events())
        by_id = {c.id: c for c in result.tool_calls}
        for key in ("f", "for", "out", "name"):
            assert not by_id[key].is_error, (key, by_id[key].output)
        assert (workspace / "running" / "c1").exists()
        assert sorted(p.name for p in workspace.glob("*.md")) == ["one.md", "two.md"]
        assert (workspace / "build" / "a.c").exists()
        assert (workspace / "report.csv").read_text() == "data\n"
        assert by_id["unknown"].is_error and "Read-only file system" in by_id["unknown"].output
        assert list(Path(outside).iterdir()) == []
