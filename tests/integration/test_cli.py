"""`clawq up`, `clawq run`, `clawq status` and `clawq mcp` as a user runs them: data on
stdout (whole in a pipe, or JSON), inline approvals on a terminal, MCP servers that show up
within seconds, and a stack that restarts a process that died."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli.local.embedded import free_port
from tests.conftest import Isolated

CLAWQ = [sys.executable, "-m", "orchestrator.cli"]
TIME = str(Path(sys.executable).parent / "mcp-server-time")


def status(env: dict[str, str]) -> dict[str, Any]:
    return json.loads(subprocess.check_output([*CLAWQ, "status", "--json"], env=env))  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def up() -> Iterator[dict[str, str]]:
    iso = Isolated()
    env = {
        **os.environ,
        **iso.env(),
        "CLAWQ_HOME": tempfile.mkdtemp(prefix="clawq-home-"),
        "CLAWQ_API_PORT": str(free_port()),  # another stack on this machine may hold 8420
    }
    proc = subprocess.Popen([*CLAWQ, "up", "--log-level", "warning"], env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            report = json.loads(subprocess.check_output([*CLAWQ, "status", "--json"], env=env))
            if report["orchestrators"] and {"fs", "runtime"} <= set(report["queues"]):
                break
            assert proc.poll() is None, "clawq up exited"
            time.sleep(0.3)
        else:
            pytest.fail("clawq up never became ready")
        yield env
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        iso.drop()


def test_up_status_and_run_json(up: dict[str, str], workspace: Path, tmp_path: Path) -> None:
    report = json.loads(subprocess.check_output([*CLAWQ, "status", "--json"], env=up))
    (orchestrator,) = report["orchestrators"]
    assert orchestrator["pid"] > 0 and orchestrator["host"]
    assert all("fs" in w["queues"] for w in report["queues"]["fs"])  # maybe with others

    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "turns": [
                    {
                        "tool_calls": [
                            {
                                "id": "w",
                                "name": "write_file",
                                "input": {"path": "a.txt", "content": "hi\n"},
                            },
                            {"id": "x", "name": "exec", "input": {"command": "cat a.txt"}},
                        ]
                    },
                    {"text": "all done"},
                ]
            }
        )
    )
    out = subprocess.run(
        [
            *CLAWQ,
            "run",
            "--model",
            "scripted",
            "--script",
            str(script),
            "--workspace",
            str(workspace),
            "--allow",
            "exec",
            "--json",
            "write and show",
        ],
        env=up,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)  # exactly one JSON object, nothing else on stdout
    assert set(result) >= {"job_id", "status", "final_text", "iterations", "tool_calls"}
    assert (result["status"], result["final_text"], result["iterations"]) == (
        "completed",
        "all done",
        2,
    )
    write, run = result["tool_calls"]
    assert set(write) >= {"id", "name", "input", "is_error", "output", "queue", "worker"}
    assert (write["queue"], run["queue"]) == ("fs", "runtime")
    assert write["worker"] != run["worker"]
    assert run["output"].startswith("hi\n")
    live_pids = {w["pid"] for q in report["queues"].values() for w in q}
    assert {
        int(write["worker"].rsplit(":", 1)[1]),
        int(run["worker"].rsplit(":", 1)[1]),
    } <= live_pids


def test_run_rejects_bad_input_clearly(up: dict[str, str], workspace: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"turns": []}))
    out = subprocess.run(
        [*CLAWQ, "run", "--script", str(bad), "--workspace", str(workspace), "--json", "x"],
        env=up,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "invalid script" in out.stderr and out.stdout == ""


def write_script(path: Path, *turns: dict[str, Any]) -> str:
    path.write_text(json.dumps({"turns": list(turns)}))
    return str(path)


def test_listing_commands_print_whole_rows_into_a_pipe_and_json_on_request(
    up: dict[str, str],
) -> None:
    long_name = "a-fairly-long-server-name-for-pipes"
    added = subprocess.run(
        [*CLAWQ, "mcp", "add", json.dumps({long_name: {"command": TIME}})],
        env=up,
        capture_output=True,
        text=True,
        check=True,
    )
    assert added.stdout == f"added {long_name}\n"
    listed = subprocess.run(
        [*CLAWQ, "mcp", "list"], env=up, capture_output=True, text=True, check=True
    )
    header, row = listed.stdout.splitlines()[:2]
    assert header.split() == [
        "name",
        "transport",
        "target",
        "enabled",
        "state",
        "error",
        "protocol",
        "auth",
    ]
    assert row.split()[:2] == [long_name, "stdio"] and TIME in row and "…" not in listed.stdout
    as_json = json.loads(subprocess.check_output([*CLAWQ, "mcp", "list", "--json"], env=up))
    assert [s["name"] for s in as_json] == [long_name]
    for command in (["status"], ["mcp", "grants"], ["mcp", "requests"], ["mcp", "tools"]):
        assert isinstance(
            json.loads(subprocess.check_output([*CLAWQ, *command, "--json"], env=up)),
            dict | list,
        )
    subprocess.run([*CLAWQ, "mcp", "remove", long_name], env=up, check=True, capture_output=True)


def test_a_new_mcp_servers_tools_reach_the_catalog_within_seconds(up: dict[str, str]) -> None:
    # the stack runs with the default 30 s health interval: only the nudge is this fast
    subprocess.run(
        [*CLAWQ, "mcp", "add", json.dumps({"clock": {"command": TIME}})],
        env=up,
        check=True,
        capture_output=True,
    )
    started = time.monotonic()
    while time.monotonic() - started < 5:
        tools = subprocess.run([*CLAWQ, "mcp", "tools"], env=up, capture_output=True, text=True)
        assert tools.returncode == 0, tools.stderr
        if "mcp_clock__get_current_time" in tools.stdout.split():
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"no clock tools after 5 s: {tools.stdout!r}")
    listed = json.loads(subprocess.check_output([*CLAWQ, "mcp", "tools", "--json"], env=up))
    assert {t["exposed_name"] for t in listed} >= {
        "mcp_clock__get_current_time",
        "mcp_clock__convert_time",
    }


LONG = "echo " + "word-" * 40 + "end"  # ~200 characters: a wrapped line would cut it


def asking(
    env: dict[str, str], tmp_path: Path, workspace: Path, *options: str
) -> subprocess.Popen[str]:
    """`clawq run --json` with no terminal on a job whose one exec call asks."""
    script = write_script(
        tmp_path / "ask.json",
        {"tool_calls": [{"id": "t", "name": "exec", "input": {"command": LONG}}]},
        {"text": "done"},
    )
    return subprocess.Popen(
        [*CLAWQ, "run", "--json", "--ask", "exec", "--script", script, "--workspace",
         str(workspace), *options, "go"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def ask_line(line: str) -> list[str]:
    """The ask as one unwrapped line: the whole command, the timeout, the answer."""
    assert line.startswith(f"? exec({LONG}) needs approval ("), line
    assert "): clawq approve " in line and "denied in" not in line  # no time limit by default
    assert line.rstrip("\n").endswith(" allow-once|allow-always|deny")
    return line.split("clawq approve ", 1)[1].split()[:2]  # job id, request id


def test_run_without_a_terminal_says_each_ask_at_once_and_fails_by_default(
    up: dict[str, str], workspace: Path, tmp_path: Path
) -> None:
    started = time.monotonic()
    proc = asking(up, tmp_path, workspace)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - started < 30  # not the approval's 120 s
    assert proc.returncode == 1
    result = json.loads(out)  # stdout is still exactly the one object
    assert result["status"] == "cancelled"
    lines = err.splitlines()
    job_id, _ = ask_line(lines[0])
    assert job_id == result["job_id"]
    assert lines[-1].startswith(f"job {job_id} stopped: exec needs approval and no one is")
    assert "--on-ask wait" in lines[-1]


def test_run_on_ask_deny_answers_at_once_and_the_job_goes_on(
    up: dict[str, str], workspace: Path, tmp_path: Path
) -> None:
    proc = asking(up, tmp_path, workspace, "--on-ask", "deny")
    out, err = proc.communicate(timeout=60)
    result = json.loads(out)
    assert (proc.returncode, result["status"], result["final_text"]) == (0, "completed", "done")
    (denied,) = result["tool_calls"]
    assert denied["is_error"] and "denied exec" in denied["output"]
    ask_line(err.splitlines()[0])


def test_run_on_ask_wait_prints_the_line_that_answers_it(
    up: dict[str, str], workspace: Path, tmp_path: Path
) -> None:
    proc = asking(up, tmp_path, workspace, "--on-ask", "wait")
    assert proc.stderr is not None
    job_id, request_id = ask_line(proc.stderr.readline())  # at once, while it waits
    answered = subprocess.run(
        [*CLAWQ, "approve", job_id, request_id, "allow-once"], env=up, capture_output=True
    )
    assert answered.returncode == 0, answered.stderr
    out, _ = proc.communicate(timeout=60)
    result = json.loads(out)
    assert (proc.returncode, result["status"]) == (0, "completed")
    assert result["tool_calls"][0]["output"].startswith(LONG[5:])


def test_run_prints_a_question_and_clawq_answer_answers_it(
    up: dict[str, str], workspace: Path, tmp_path: Path
) -> None:
    asked = {"question": "Which colour?", "choices": ["red", "blue"]}
    script = write_script(
        tmp_path / "question.json",
        {"tool_calls": [{"id": "q", "name": "ask_user", "input": asked}]},
        {"text": "done"},
    )
    proc = subprocess.Popen(
        [*CLAWQ, "run", "--json", "--script", script, "--workspace", str(workspace),
         "--on-ask", "wait", "go"],
        env=up, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert line.startswith("? Which colour? [red|blue]: clawq answer "), line
    job_id, request_id = line.split("clawq answer ", 1)[1].split()[:2]
    wrong = subprocess.run(
        [*CLAWQ, "answer", job_id, request_id, "green"], env=up, capture_output=True, text=True
    )
    assert wrong.returncode != 0 and "answer with one of: red, blue" in wrong.stderr
    answered = subprocess.run(
        [*CLAWQ, "answer", job_id, request_id, "blue"], env=up, capture_output=True, text=True
    )
    assert answered.returncode == 0, answered.stderr
    listed = subprocess.run([*CLAWQ, "requests", "--json"], env=up, capture_output=True, text=True)
    assert request_id not in listed.stdout
    out, _ = proc.communicate(timeout=60)
    result = json.loads(out)
    assert result["status"] == "completed", result
    assert result["tool_calls"][0]["output"].endswith("answered: blue")


def test_run_on_a_terminal_asks_inline_and_always_is_remembered(
    up: dict[str, str], workspace: Path, tmp_path: Path
) -> None:
    import pexpect

    from broker.config.settings import Settings
    from broker.pg.store import Store

    script = write_script(
        tmp_path / "s.json",
        {"tool_calls": [{"id": "t", "name": "exec", "input": {"command": "touch asked"}}]},
        {"text": "done"},
    )
    child = pexpect.spawn(
        CLAWQ[0],
        [*CLAWQ[1:], "run", "--script", script, "--workspace", str(workspace), "go"],
        env={**up, "NO_COLOR": "1"},
        encoding="utf-8",
        timeout=60,
    )
    child.expect("exec needs approval")
    child.expect(r"allow \[o\]nce, allow \[a\]lways, or \[d\]eny\?")
    child.sendline("a")
    child.expect("completed")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    assert (workspace / "asked").exists()
    store = Store(Settings(database_url=up["CLAWQ_DATABASE_URL"]).database_url)
    try:
        assert "exec(touch asked)" in store.grants("", "main")  # `clawq run`'s user: none
    finally:
        store.close()


def test_a_process_of_the_stack_that_dies_is_restarted(
    up: dict[str, str], workspace: Path, tmp_path: Path
) -> None:
    (old,) = status(up)["orchestrators"]
    os.kill(old["pid"], signal.SIGKILL)
    started = time.monotonic()
    while time.monotonic() - started < 5:
        found = status(up)["orchestrators"]
        if found and found[0]["pid"] != old["pid"]:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the orchestrator was not restarted within 5 s")
    script = write_script(
        tmp_path / "s.json",
        {"tool_calls": [{"id": "w", "name": "write_file", "input": {"path": "a", "content": "x"}}]},
        {"text": "after the restart"},
    )
    out = subprocess.run(
        [*CLAWQ, "run", "--script", script, "--workspace", str(workspace), "--json", "again"],
        env=up,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(out.stdout)["final_text"] == "after the restart", out.stderr
