"""Confinement of host commands under bubblewrap, for real: what a command may not touch
even when the parser lets it through (an interpreter with inline code)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.config.settings import Settings
from tests.processes import gone_within, pids_with, token, wait_for_pids
from tests.workers.conftest import Runner
from workers.confine import host as confine


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory outside the workspace that the confined command can see (not /tmp,
    which is private inside): writing there must fail."""
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="clawq-outside-") as path:
        yield Path(path)


def confined(settings: Settings | None = None) -> confine.Confinement:
    found = confine.for_settings(settings or Settings())
    assert found.confined, "bubblewrap is not usable on this machine (see .ci/run)"
    return found


def test_a_command_that_writes_outside_the_workspace_fails_and_the_target_stays(
    run_tool: Runner, workspace: Path, outside: Path
) -> None:
    confined()
    target = outside / "target.txt"
    target.write_text("original")
    sibling = workspace.parent / "sibling.txt"  # beside the workspace, in the host's /tmp
    sibling.write_text("original")
    for command in [
        f'python3 -c \'open("{target}", "w").write("x")\'',
        f'perl -e \'open(F, ">", "{target}") or die "$!"; print F "x"\'',
        f'awk \'BEGIN {{ printf "x" > "{target}" }}\'',
        f"python3 -c 'import os; os.remove(\"{target}\")'",
    ]:
        result = run_tool("exec", command=command)
        assert result.is_error, (command, result.for_llm)
        assert result.metadata["where"] == "host (bwrap)"
    # the host's /tmp is not there: the write lands in the command's private /tmp
    run_tool("exec", command=f'python3 -c \'open("{sibling}", "w").write("x")\'')
    assert target.read_text() == "original" and sibling.read_text() == "original"
    inside = run_tool("exec", command='python3 -c \'open("made.txt", "w").write("ok")\'')
    assert not inside.is_error and (workspace / "made.txt").read_text() == "ok"


def test_kill_minus_one_inside_reaches_only_the_commands_own_tree(workspace: Path) -> None:
    confinement = confined()
    mark = token()
    bystander = subprocess.Popen(["sleep", mark])  # a process of the worker's host
    try:
        # the command kills only when it sees its own PID namespace (pid 1 is bubblewrap),
        # so a broken confinement cannot take the machine down with this test
        script = (
            f"sleep {mark} & sleep 0.3; "
            '[ "$(cat /proc/1/comm)" = bwrap ] && kill -9 -1; sleep 0.3; '
            "if kill -0 $! 2>/dev/null; then echo alive; else echo killed; fi"
        )
        argv = confinement.argv(script, str(workspace), str(workspace))
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
        assert done.stdout == b"killed\n", done  # it reached the command's own sleep
        assert bystander.poll() is None, "kill -9 -1 reached a process outside"
        assert pids_with(mark) == [bystander.pid]
    finally:
        bystander.kill()
        bystander.wait()


def test_home_and_secrets_are_not_visible(
    workspace: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = outside / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text("aws_secret_access_key=x")
    monkeypatch.setenv("HOME", str(home))
    run_tool = Runner(workspace, Settings())
    assert confine.for_settings(run_tool.settings).confined
    for command in ["cat ~/.ssh/id_ed25519", f"cat {home}/.aws/credentials", "ls /run/postgresql"]:
        result = run_tool("exec", command=command)
        assert result.is_error and "PRIVATE" not in result.for_llm, (command, result.for_llm)
    listing = run_tool("exec", command="find ~ /root -mindepth 1 | wc -l").for_llm
    assert listing.startswith("0\n"), listing  # both empty
    assert os.path.exists(home / ".ssh" / "id_ed25519")


@pytest.fixture
def listener() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.sendall(b"hello\n")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


def test_the_network_is_off_unless_allowed(workspace: Path, listener: int) -> None:
    confined()
    probe = (
        'python3 -c \'import socket; s = socket.create_connection(("127.0.0.1", '
        f"{listener}), timeout=3); print(s.recv(10).decode().strip())'"
    )
    off = Runner(workspace, Settings())("exec", command=probe)
    assert off.is_error and "hello" not in off.for_llm
    assert "Connection refused" in off.for_llm or "unreachable" in off.for_llm
    on = Runner(workspace, Settings(), network=True)("exec", command=probe)
    assert not on.is_error and on.for_llm.startswith("hello"), on.for_llm


def test_a_timeout_kills_the_whole_tree(run_tool: Runner) -> None:
    confined()
    mark = token()
    started = time.monotonic()
    result = run_tool("exec", command=f"(setsid sleep {mark} &) ; sleep {mark}", timeout_s=1)
    assert result.is_error and "timed out after 1s" in result.for_llm
    assert time.monotonic() - started < 8
    gone_within(mark, 2.0)


def run_and_die(run_tool: Runner, command: str, delay_s: float) -> int:
    """Run `command` with exec in a forked worker that is killed `delay_s` after the
    command is spawned; its wait status."""
    child = os.fork()
    if child == 0:
        try:
            spawn = subprocess.Popen

            def popen(*args: object, **kwargs: object) -> object:
                proc = spawn(*args, **kwargs)  # type: ignore[call-overload]
                threading.Timer(delay_s, os.kill, (os.getpid(), signal.SIGKILL)).start()
                return proc

            subprocess.Popen = popen  # type: ignore[assignment,misc]
            run_tool("exec", command=command)
        finally:
            os._exit(1)  # never back into pytest
    return os.waitpid(child, 0)[1]


def test_a_worker_killed_as_its_command_starts_never_lets_it_run(
    run_tool: Runner, workspace: Path
) -> None:
    """bubblewrap's own --die-with-parent misses a worker killed in its first milliseconds
    (the sandbox lived on under init, and a redelivered call ran beside it): every moment
    of the start is tried, and no command runs on once its worker is dead. What may stay
    is bubblewrap's own child, killed before its setup ended: blocked, it runs nothing."""
    confined()
    marks = [token() for _ in range(16)]
    try:
        for delay_ms, mark in enumerate(marks):
            command = f"sleep 0.5; echo ran > ran-{delay_ms}; sleep {mark}"
            status = run_and_die(run_tool, command, delay_ms / 1000)
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        time.sleep(1.0)  # what survived its worker has written by now
        assert sorted(p.name for p in workspace.iterdir()) == []
        for mark in marks:
            left = [(pid, comm(pid)) for pid in pids_with(mark)]
            assert all(name == "bwrap" for _, name in left), left  # no shell, no sleep
    finally:
        for mark in marks:
            for pid in pids_with(mark):
                os.kill(pid, signal.SIGKILL)


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def test_a_cancel_kills_the_whole_tree(run_tool: Runner) -> None:
    confined()
    mark = token()
    at = time.monotonic() + 1.0
    run_tool.cancelled = lambda: "the job was cancelled" if time.monotonic() > at else None
    result = run_tool("exec", command=f"nohup sleep {mark} & sleep {mark}")
    assert result.is_error and "[stopped: the job was cancelled]" in result.for_llm
    gone_within(mark, 2.0)


def test_output_caps_hold_under_confinement(workspace: Path) -> None:
    confined()
    result = Runner(workspace, Settings(exec_output_cap_bytes=2048))(
        "exec", command="yes abcdefgh | head -c 100000"
    )
    assert "[output truncated at 2048 bytes]" in result.for_llm and len(result.for_llm) < 2300


def test_required_but_missing_bubblewrap_fails_every_call_closed(
    workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(exec_confinement="bwrap", exec_bwrap_path="no-such-bwrap")
    with caplog.at_level(logging.ERROR, "clawq.confine"):
        result = Runner(workspace, settings)("exec", command="touch ran")
    assert result.is_error
    assert result.for_llm == (
        "exec confinement is required (CLAWQ_EXEC_CONFINEMENT=bwrap) but bubblewrap does not "
        "work here: no-such-bwrap is not installed; the command was not run"
    )
    assert not (workspace / "ran").exists()
    assert "every command will fail" in caplog.text


def test_auto_without_bubblewrap_warns_once_and_runs_unconfined(
    workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(exec_confinement="auto", exec_bwrap_path="missing-bwrap-auto")
    with caplog.at_level(logging.WARNING, "clawq.confine"):
        first = Runner(workspace, settings)("exec", command="touch ran")
        second = Runner(workspace, settings)("exec", command="true")
    assert not first.is_error and first.metadata["where"] == "host"
    assert not second.is_error and (workspace / "ran").exists()
    warnings = [r for r in caplog.records if "run unconfined" in r.getMessage()]
    assert len(warnings) == 1


def test_none_runs_as_the_worker(run_tool: Runner, workspace: Path) -> None:
    result = Runner(workspace, Settings(exec_confinement="none"))("exec", command="echo $$")
    assert result.metadata["where"] == "host" and int(result.for_llm.split()[0]) > 2


def test_a_background_process_is_confined_and_signalled_through_its_namespace(
    workspace: Path, outside: Path, tmp_path: Path
) -> None:
    from tests.workers.test_process import call, wait_output

    confined()
    settings = Settings(process_state_dir=str(tmp_path / "procs"))
    mark = token()
    target = outside / "t"
    target.write_text("original")
    started = call(
        settings,
        workspace,
        action="start",
        command=(
            f"trap 'echo got-usr1' USR1; sleep {mark} & "
            f'python3 -c \'open("{target}", "w")\' 2>/dev/null || echo refused; '
            "while :; do sleep 0.1; done"
        ),
    )
    pid = started.metadata["id"]
    assert "refused" in wait_output(settings, workspace, pid, "refused")
    call(settings, workspace, action="signal", id=pid, signal="USR1")
    assert "got-usr1" in wait_output(settings, workspace, pid, "got-usr1")  # delivered, alive
    wait_for_pids(mark)
    call(settings, workspace, action="signal", id=pid, signal="KILL")
    assert "[exited" in wait_output(settings, workspace, pid, "[exited")
    gone_within(mark, 3.0)  # the whole namespace went with it
    assert target.read_text() == "original"


def test_the_probe_reports_why_bubblewrap_cannot_run(tmp_path: Path) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    reason = confine.probe(str(fake), ())
    assert reason == "bubblewrap failed: bwrap: No permissions to create new namespace"
    assert confine.probe(sys.executable, ()) != ""  # not a bubblewrap at all


def test_a_target_the_line_cannot_say_runs_confined_and_stays_inside(
    workspace: Path, outside: Path
) -> None:
    """Issue 27: 5. Allowed without approval because it runs confined: wherever the
    variable points, the command changes nothing outside the workspace."""
    confined()
    (outside / "keep.txt").write_text("original")
    (workspace / "where").write_text(str(outside))
    run_tool = Runner(workspace, Settings())
    run_tool.confined = True
    result = run_tool(
        "exec", command='d=$(cat where); rm -rf "$d"/keep.txt; touch "$d"/made; mkdir -p out'
    )
    assert result.metadata["where"] == "host (bwrap)"
    assert "Read-only file system" in result.for_llm, result.for_llm
    assert (outside / "keep.txt").read_text() == "original"
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert (workspace / "out").is_dir()  # the workspace is the command's to change


def test_a_call_allowed_because_it_runs_confined_never_runs_unconfined(workspace: Path) -> None:
    run_tool = Runner(workspace, Settings(exec_confinement="none"))
    run_tool.confined = True
    refused = run_tool("exec", command='d=$(cat where); touch "$d"/x; touch ran')
    assert refused.is_error and refused.for_llm.startswith(
        "not run: this command was allowed without approval because commands run confined"
    )
    assert not (workspace / "ran").exists()
    run_tool.confined = False  # approved by a person: it runs where it is
    assert not run_tool("exec", command="touch ran").is_error
    assert (workspace / "ran").exists()


def test_the_result_says_which_named_path_the_sandbox_does_not_show(
    workspace: Path, outside: Path
) -> None:
    """`perl -e 'system("rm -rf ../x")'` 'succeeds' in the sandbox, where ../x is not
    there (the host's /tmp is private); the model is told, and ../x is untouched."""
    confined()
    sibling = workspace.parent / "x"
    (sibling / "data").mkdir(parents=True)
    command = "perl -e 'system(\"rm -rf ../x\")'"
    result = Runner(workspace, Settings())("exec", command=command)
    assert not result.is_error and result.metadata["where"] == "host (bwrap)"
    assert result.for_llm.endswith(
        "[exit code 0]\n[note: ../x is outside the workspace and not visible in the sandbox "
        "(a confined command sees the workspace, a private /tmp and the system read-only), so "
        "the command neither read nor changed it]"
    ), result.for_llm
    assert (sibling / "data").is_dir()
    hidden = Runner(workspace, Settings())("exec", command="cat /etc/shadow ~/.ssh/x || true")
    assert "[note: /etc/shadow is outside" in hidden.for_llm, hidden.for_llm
    visible = Runner(workspace, Settings())("exec", command=f"ls {outside} /usr/bin/env")
    assert "[note:" not in visible.for_llm  # seen read-only: nothing to explain
    unconfined = Runner(workspace, Settings(exec_confinement="none"))
    assert "[note:" not in unconfined("exec", command="ls ../x").for_llm


def inside(workspace: Path, command: str, settings: Settings | None = None) -> str:
    """What `command` prints when run as exec runs it, confined (stdout and stderr)."""
    result = Runner(workspace, settings or Settings())("exec", command=command)
    assert result.metadata["where"] == "host (bwrap)", result.for_llm
    return result.for_llm


def test_capabilities_namespaces_and_privileges_seen_from_inside(workspace: Path) -> None:
    """--cap-drop ALL (a root worker keeps CHOWN, DAC_OVERRIDE and FOWNER: bits 0, 1, 3,
    also ambient so its children keep them), no_new_privs, and IPC, UTS, PID, mount and
    network namespaces of the command's own, read from /proc inside the sandbox and
    compared with the worker's. (bubblewrap run as root leaves the bounding set whole;
    with no_new_privs no execve can raise a capability from it.)"""
    confined()
    status = inside(
        workspace, "grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status"
    )
    fields = dict(line.split(":\t") for line in status.splitlines() if ":\t" in line)
    kept = (1 << 0) | (1 << 1) | (1 << 3) if os.geteuid() == 0 else 0
    for name in ("CapEff", "CapPrm", "CapAmb"):
        assert int(fields[name], 16) == kept, (name, fields)
    assert fields["NoNewPrivs"].strip() == "1"
    names = ("ipc", "uts", "pid", "mnt", "net")
    seen = inside(workspace, " ; ".join(f"readlink /proc/self/ns/{n}" for n in names))
    ours = [os.readlink(f"/proc/self/ns/{n}") for n in names]
    theirs = [line for line in seen.splitlines() if line.endswith("]") and ":[" in line]
    assert len(theirs) == len(names)
    for name, mine, its in zip(names, ours, theirs, strict=True):
        assert mine != its, f"the {name} namespace is the worker's"
    assert inside(workspace, "hostname x 2>&1; echo $?").splitlines()[-2] != "0"  # no SYS_ADMIN


def test_every_hidden_path_is_empty_or_gone_from_inside(workspace: Path, outside: Path) -> None:
    """Each configured hidden path that exists here, and a secret of our own among them:
    inside, a directory lists nothing and a file reads as empty."""
    confined()
    (outside / "secret.txt").write_text("TOP SECRET")
    settings = Settings(exec_hidden_paths=[*Settings().exec_hidden_paths, str(outside)])
    hidden = [p for p in confine.hidden_paths(settings) if os.path.exists(p)]
    assert str(outside) in hidden and "/etc/shadow" in hidden and "/root" in hidden
    for path in hidden:
        what = "find {0} -mindepth 1 | head -3" if os.path.isdir(path) else "wc -c < {0}"
        out = inside(workspace, what.format(path) + "; echo END", settings)
        seen = out.split("END")[0].strip()
        assert seen in ("", "0"), (path, out)
    assert "TOP SECRET" not in inside(workspace, f"cat {outside}/secret.txt; true", settings)


def test_other_users_workspaces_artifacts_and_granted_roots_are_not_visible(
    outside: Path,
) -> None:
    """A job sees its own workspace and none of the others under the roots (issue 26):
    the roots are hidden and the job's workspace is bound back over them."""
    root, shared, artifacts = outside / "workspaces", outside / "shared", outside / "artifacts"
    for user in ("alice", "bob"):
        (root / user).mkdir(parents=True)
        (shared / user).mkdir(parents=True)
        (root / user / "mine.txt").write_text(f"{user}'s")
        (shared / user / "mine.txt").write_text(f"{user}'s shared")
    (artifacts / "ab").mkdir(parents=True)
    (artifacts / "ab" / "abcdef").write_text("alice's artifact")
    settings = Settings(
        workspace_root=str(root),
        artifact_dir=str(artifacts),
        user_ceilings={"*": {"workspace_roots": [f"{shared}/{{user}}"]}},
    )
    assert confine.granted_roots(settings) == [str(shared)]
    for workspace in (root / "bob", shared / "bob"):
        run_tool = Runner(workspace, settings)
        own = run_tool("exec", command="cat mine.txt")
        assert not own.is_error and own.for_llm.startswith("bob's"), own.for_llm
        for command in [
            f"cat {root}/alice/mine.txt",
            f"cat {shared}/alice/mine.txt",
            f"cat {artifacts}/ab/abcdef",
        ]:
            result = run_tool("exec", command=command)
            assert result.is_error and "alice's" not in result.for_llm, (command, result.for_llm)
        listing = run_tool("exec", command=f"ls {root} {shared}").for_llm
        assert "alice" not in listing, listing
    assert (root / "alice" / "mine.txt").read_text() == "alice's"


def test_a_granted_root_names_the_directory_that_holds_every_users() -> None:
    ceilings = {
        "*": {"workspace_roots": ["/srv/a/{user}", "/srv/b/ws-{user}", "/srv/c", "/{user}"]}
    }
    roots = confine.granted_roots(Settings(user_ceilings=ceilings))
    assert roots == ["/srv/a", "/srv/b", "/srv/c", ""]
    hidden = confine.hidden_paths(Settings(user_ceilings=ceilings))
    assert "/srv/a" in hidden and "/" not in hidden  # `/{user}` never hides the system
