"""Hooks speak Claude Code's protocol: real commands, exit codes, JSON, timeouts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.config.policy import HooksConfig
from broker.config.settings import Settings
from orchestrator.calls.hooks import HOOK_ENV, HookInput, HookOutcome, HookOutput, Hooks, matches
from workers.confine import host as confine


def hook_input(tool: str = "exec", **extra: Any) -> HookInput:
    return HookInput(
        session_id="s1",
        cwd="/tmp",
        permission_mode="default",
        hook_event_name="PreToolUse",
        tool_name=tool,
        tool_input={"command": "ls"},
        tool_use_id="call_1",
        **extra,
    )


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(f"import json, sys, time\n{body}\n")
    return f"{sys.executable} {path}"


def run(config: dict[str, Any], data: HookInput | None = None, **python: Any) -> HookOutcome:
    hooks = Hooks(HooksConfig.model_validate(config), **python)
    return asyncio.run(hooks.run(data or hook_input()))


def pre(command: str, matcher: str = "exec", timeout: float = 10) -> dict[str, Any]:
    return {
        "PreToolUse": [{"matcher": matcher, "hooks": [{"command": command, "timeout": timeout}]}]
    }


def test_stdin_carries_the_protocol_fields(tmp_path: Path) -> None:
    seen = tmp_path / "seen.json"
    command = script(tmp_path, "h.py", f"open({str(seen)!r}, 'w').write(sys.stdin.read())")
    run(pre(command))
    data = json.loads(seen.read_text())
    assert data == {
        "session_id": "s1",
        "cwd": "/tmp",
        "permission_mode": "default",
        "hook_event_name": "PreToolUse",
        "tool_name": "exec",
        "tool_input": {"command": "ls"},
        "tool_use_id": "call_1",
        "tool_response": None,
    }


@pytest.mark.parametrize(
    ("body", "behavior", "reason"),
    [
        ("sys.stderr.write('no rm here'); sys.exit(2)", "deny", "no rm here"),
        ("sys.exit(1)", None, ""),  # a non-blocking error changes nothing
        ("print('plain text')", None, ""),
        (
            "print(json.dumps({'hookSpecificOutput': {'hookEventName': 'PreToolUse',"
            " 'permissionDecision': 'deny', 'permissionDecisionReason': 'policy'}}))",
            "deny",
            "policy",
        ),
        ("print(json.dumps({'hookSpecificOutput': {'permissionDecision': 'ask'}}))", "ask", ""),
        ("print(json.dumps({'hookSpecificOutput': {'permissionDecision': 'allow'}}))", "allow", ""),
        ("print(json.dumps({'decision': 'block', 'reason': 'old style'}))", "deny", "old style"),
        ("time.sleep(5)", "ask", "timed out after 0.5s"),
    ],
)
def test_exit_codes_json_and_timeouts(
    tmp_path: Path, body: str, behavior: str | None, reason: str
) -> None:
    outcome = run(pre(script(tmp_path, "h.py", body), timeout=0.5))
    if behavior is None:
        assert outcome.verdict is None
    else:
        assert outcome.verdict is not None and outcome.verdict.behavior == behavior
        assert reason in outcome.verdict.reason
    assert len(outcome.ran) == 1


def test_updated_input_and_context(tmp_path: Path) -> None:
    body = (
        "print(json.dumps({'hookSpecificOutput': {'permissionDecision': 'allow',"
        " 'updatedInput': {'command': 'ls -la'}, 'additionalContext': 'listed'}}))"
    )
    outcome = run(pre(script(tmp_path, "h.py", body)))
    assert outcome.updated_input == {"command": "ls -la"}
    assert outcome.context == ["listed"]


def test_decisions_combine_deny_over_ask_over_allow(tmp_path: Path) -> None:
    allow = script(
        tmp_path,
        "a.py",
        "print(json.dumps({'hookSpecificOutput': {'permissionDecision': 'allow'}}))",
    )
    ask = script(
        tmp_path, "b.py", "print(json.dumps({'hookSpecificOutput': {'permissionDecision': 'ask'}}))"
    )
    deny = script(tmp_path, "c.py", "sys.exit(2)")
    config = {"PreToolUse": [{"matcher": "", "hooks": [{"command": allow}, {"command": ask}]}]}
    assert run(config).verdict.behavior == "ask"  # type: ignore[union-attr]
    config["PreToolUse"].append({"matcher": "Bash", "hooks": [{"command": deny}]})
    assert run(config).verdict.behavior == "deny"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("matcher", "tool", "expected"),
    [
        ("", "exec", True),
        ("*", "write_file", True),
        ("exec", "exec", True),
        ("Bash", "exec", True),
        ("Edit|Write", "write_file", True),
        ("Edit|Write", "exec", False),
        ("mcp_.*", "mcp_github__create_issue", True),
        ("mcp_.*", "exec", False),
        ("read_file", "read_file_x", False),
        ("([", "exec", False),
    ],
)
def test_matchers(matcher: str, tool: str, expected: bool) -> None:
    assert matches(matcher, tool) is expected


def test_python_hooks_sync_and_async() -> None:
    def deny_rm(data: HookInput) -> HookOutput | None:
        if "rm" in data.tool_input.get("command", ""):
            return HookOutput.model_validate(
                {
                    "hookSpecificOutput": {
                        "permissionDecision": "deny",
                        "permissionDecisionReason": "rm",
                    }
                }
            )
        return None

    async def rewrite(data: HookInput) -> dict[str, Any]:
        return {"hookSpecificOutput": {"updatedInput": {"command": "echo safe"}}}

    outcome = run({}, hook_input(), pre=[("exec", deny_rm), ("exec", rewrite)])
    assert outcome.verdict is None and outcome.updated_input == {"command": "echo safe"}
    data = hook_input()
    data.tool_input = {"command": "rm -rf /"}
    outcome = run({}, data, pre=[("exec", deny_rm)])
    assert outcome.verdict is not None and outcome.verdict.behavior == "deny"
    assert run({}, hook_input("read_file"), pre=[("exec", deny_rm)]).ran == []


def test_problems_name_a_missing_program_and_a_bad_regex_but_not_shell_lines() -> None:
    config = HooksConfig.model_validate(
        {
            "PreToolUse": [
                {"matcher": "exec", "hooks": [{"command": "/nonexistent/guard --strict"}]},
                {"matcher": "(unclosed", "hooks": [{"command": "LANG=C sh -c 'exit 0'"}]},
                {"matcher": "*", "hooks": [{"command": f"{sys.executable} -c pass"}]},
                {"matcher": "", "hooks": [{"command": "$HOOK_BIN/check"}]},
            ]
        }
    )
    problems = Hooks(config).problems()
    assert problems == [
        "hook program '/nonexistent/guard' is not found on this host",
        "hook matcher '(unclosed' is not a regex: missing ), unterminated subpattern at position 0",
    ]


# what a command hook may see and touch on the orchestrator's host (issue 26)


def bwrap() -> Settings:
    settings = Settings(exec_confinement="bwrap")
    assert confine.for_settings(settings).confined, "bubblewrap is not usable here (.ci/run)"
    return settings


def in_workspace(workspace: Path) -> HookInput:
    data = hook_input()
    data.cwd = str(workspace)
    return data


def run_with(settings: Settings, command: str, data: HookInput) -> HookOutcome:
    return asyncio.run(Hooks(HooksConfig.model_validate(pre(command)), settings=settings).run(data))


@pytest.mark.parametrize("confinement", ["bwrap", "none"])
def test_a_hook_sees_no_secret_of_the_orchestrator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, confinement: str
) -> None:
    settings = bwrap() if confinement == "bwrap" else Settings(exec_confinement="none")
    monkeypatch.setenv("CLAWQ_SECRET_KEY", "secret-key-value-26")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-value-26")
    monkeypatch.setenv("LANG", "C.UTF-8")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    outcome = run_with(settings, "env > env.txt", in_workspace(workspace))
    assert outcome.ran and outcome.verdict is None
    seen = dict(line.split("=", 1) for line in (workspace / "env.txt").read_text().splitlines())
    assert "secret-key-value-26" not in seen.values() and "sk-openai-value-26" not in seen.values()
    assert seen["CLAWQ_PROJECT_DIR"] == seen["CLAUDE_PROJECT_DIR"] == str(workspace)
    assert seen["LANG"] == "C.UTF-8"
    assert set(seen) <= {*HOOK_ENV, "CLAWQ_PROJECT_DIR", "CLAUDE_PROJECT_DIR", "PWD", "SHLVL", "_"}


@pytest.fixture
def visible_outside() -> Iterator[Path]:
    """Outside the workspace and not under /tmp (which is private inside): read-only."""
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="clawq-hook-outside-") as path:
        yield Path(path)


def test_a_confined_hook_writes_only_in_the_workspace(
    tmp_path: Path, visible_outside: Path
) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    command = f"touch {outside}/hooked {visible_outside}/hooked; touch made.txt"
    outcome = run_with(bwrap(), command, in_workspace(workspace))
    assert outcome.ran and outcome.verdict is None
    assert (workspace / "made.txt").exists()
    assert not (outside / "hooked").exists() and not (visible_outside / "hooked").exists()


def test_unconfined_a_hook_runs_as_exec_does_then(tmp_path: Path) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    run_with(Settings(exec_confinement="none"), f"touch {outside}/hooked", in_workspace(workspace))
    assert (outside / "hooked").exists()


@pytest.fixture
def listener() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = server.accept()
                conn.sendall(b"hello\n")
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


@pytest.mark.parametrize("network", [False, True])
def test_a_confined_hook_has_the_network_only_when_exec_has(
    tmp_path: Path, listener: int, network: bool
) -> None:
    probe = script(
        tmp_path,
        "net.py",
        "import socket\n"
        "try:\n"
        f"    got = socket.create_connection(('127.0.0.1', {listener}), timeout=3).recv(10)\n"
        "except OSError as exc:\n"
        "    got = repr(exc).encode()\n"
        "print(json.dumps({'hookSpecificOutput': {'additionalContext': got.decode()}}))",
    )
    settings = bwrap().model_copy(update={"exec_network": network})
    outcome = run_with(settings, probe, in_workspace(tmp_path))
    assert (outcome.context == ["hello\n"]) is network, outcome.context


def test_hidden_paths_stay_hidden_but_the_hook_itself_runs(
    tmp_path: Path, visible_outside: Path
) -> None:
    hidden = visible_outside / "admin"
    hidden.mkdir()
    (hidden / "secret.txt").write_text("admin secret")
    body = (
        "import os\n"
        "seen = os.listdir(os.path.dirname(os.path.abspath(__file__)))\n"
        "print(json.dumps({'hookSpecificOutput': {'additionalContext': ','.join(seen)}}))"
    )
    command = script(hidden, "guard.py", body)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    settings = bwrap().model_copy(update={"exec_hidden_paths": [str(hidden)]})
    outcome = run_with(settings, command, in_workspace(workspace))
    assert outcome.context == ["guard.py"]  # its own file only, not the secret beside it


def test_a_workspace_elsewhere_gets_a_scratch_directory(tmp_path: Path) -> None:
    data = hook_input()
    data.cwd = str(tmp_path / "on-the-worker's-host")
    body = "open('x', 'w'); print(json.dumps({'hookSpecificOutput': {'additionalContext': 'ok'}}))"
    outcome = run_with(bwrap(), script(tmp_path, "h.py", body), data)
    assert outcome.context == ["ok"]
    assert not os.path.exists(data.cwd)


def test_a_hook_that_must_be_confined_and_cannot_be_denies_and_is_a_problem(
    tmp_path: Path,
) -> None:
    settings = Settings(exec_confinement="bwrap", exec_bwrap_path="no-such-bwrap-for-hooks")
    outside = tmp_path / "ran"
    outcome = run_with(settings, f"touch {outside}", hook_input())
    assert outcome.verdict is not None and outcome.verdict.behavior == "deny"
    assert "was not run" in outcome.verdict.reason and not outside.exists()
    config = HooksConfig.model_validate(pre("true"))
    assert Hooks(config, settings=settings).problems() == [
        "hook commands cannot be confined: no-such-bwrap-for-hooks is not installed"
    ]
    assert Hooks(HooksConfig(), settings=settings).problems() == []  # Python hooks only
