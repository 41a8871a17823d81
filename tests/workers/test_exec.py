from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from broker.config.settings import Settings
from tests.processes import gone_within, token
from tests.workers.conftest import Runner


def test_exit_code_stdout_and_stderr(run_tool: Runner, workspace: Path) -> None:
    ok = run_tool("exec", command="echo hi; echo oops >&2")
    assert not ok.is_error
    assert ok.for_llm == "hi\n[stderr]\noops\n[exit code 0]"
    failed = run_tool("exec", command="exit 3")
    assert failed.is_error and failed.metadata["exit_code"] == 3
    assert failed.for_llm.endswith("[exit code 3]")


def test_runs_in_the_workspace_and_working_dir(run_tool: Runner, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    assert run_tool("exec", command="pwd").for_llm.startswith(str(workspace.resolve()))
    assert run_tool("exec", command="pwd", working_dir="sub").for_llm.startswith(
        str((workspace / "sub").resolve())
    )
    assert run_tool("exec", command="pwd", working_dir="../..").is_error


def test_output_is_capped_with_a_marker(workspace: Path) -> None:
    runner = Runner(workspace, Settings(exec_output_cap_bytes=2048))
    result = runner("exec", command="yes abcdefgh | head -c 100000")
    assert "[output truncated at 2048 bytes]" in result.for_llm
    assert len(result.for_llm) < 2300


@pytest.mark.parametrize("confinement", ["none", "auto"])
def test_timeout_kills_the_whole_process_group(workspace: Path, confinement: str) -> None:
    mark = token()
    run_tool = Runner(workspace, Settings(exec_confinement=confinement))  # type: ignore[arg-type]
    started = time.monotonic()
    result = run_tool("exec", command=f"(sleep {mark}; touch late) & sleep {mark}", timeout_s=1)
    assert time.monotonic() - started < 8
    assert result.is_error and "timed out after 1s" in result.for_llm
    gone_within(mark, 2.0)  # the background subshell's sleep too, not only the shell


def test_environment_has_no_worker_secrets(
    run_tool: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAWQ_DATABASE_URL", "postgresql://u:pw@db/x")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "abc")
    env = run_tool("exec", command="env").for_llm
    assert "pw@db" not in env and "sk-secret" not in env and "AWS_SECRET" not in env
    assert "PATH=" in env


def test_timeout_is_capped(workspace: Path) -> None:
    runner = Runner(workspace, Settings(exec_max_timeout_s=2))
    tool = runner.registry.get("exec")
    assert tool is not None
    args = tool.input_model.model_validate({"command": "true", "timeout_s": 999})
    assert tool.timeout(args, runner.settings) == 2
    assert os.path.isdir(workspace)


def test_dangerous_commands_never_run_even_when_sent_straight_to_a_worker(
    run_tool: Runner, workspace: Path
) -> None:
    result = run_tool("exec", command="touch before && rm -rf ~ ; touch after")
    assert result.is_error
    assert result.for_llm.startswith("blocked (destructive file operation): `rm -rf ~`")
    assert not (workspace / "before").exists() and not (workspace / "after").exists()


@pytest.mark.parametrize(
    ("command", "safe"),
    [
        ("ls -la", True),
        ("cat a.txt | grep x | wc -l", True),
        ("git status && git diff HEAD", True),
        ("find . -name '*.py'", True),
        ("sleep 0.1", True),
        ("timeout 5 cat x", True),
        ("echo hi > out.txt", False),
        ("find . -delete", False),
        ("sed -i s/a/b/ f", False),
        ("git commit -m x", False),
        ("rm x", False),
        ("make test", False),
        ("FOO=1 ls", False),
        ("$CMD", False),
        ("echo 'unterminated", False),
    ],
)
def test_exec_is_concurrency_safe_only_when_it_only_reads(command: str, safe: bool) -> None:
    from workers.registry import default_registry

    tool = default_registry().get("exec")
    assert tool is not None
    assert tool.concurrency_safe(tool.input_model.model_validate({"command": command})) is safe
