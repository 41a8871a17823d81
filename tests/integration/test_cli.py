"""`clawq up` + `clawq run --json` + `clawq status --json` as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Isolated

CLAWQ = [sys.executable, "-m", "orchestrator.cli"]


@pytest.fixture
def up(isolated: Isolated) -> Iterator[dict[str, str]]:
    env = {**os.environ, **isolated.env()}
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


def test_up_status_and_run_json(up: dict[str, str], workspace: Path, tmp_path: Path) -> None:
    report = json.loads(subprocess.check_output([*CLAWQ, "status", "--json"], env=up))
    (orchestrator,) = report["orchestrators"]
    assert orchestrator["pid"] > 0 and orchestrator["host"]
    assert all(w["queue"] == "fs" for w in report["queues"]["fs"])

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
