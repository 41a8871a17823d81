"""Hooks speak Claude Code's protocol: real commands, exit codes, JSON, timeouts."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from broker.policy_config import HooksConfig
from orchestrator.hooks import HookInput, HookOutcome, HookOutput, Hooks, matches


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
