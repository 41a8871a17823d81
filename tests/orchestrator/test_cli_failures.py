"""Expected failures of the command line are one line that says what to do, never a
traceback (issue 30): Redis or PostgreSQL away, a local stack that stopped but left its
state file."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from orchestrator.cli import main as cli
from orchestrator.cli.local.embedded import free_port
from tests.conftest import Isolated


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith("CLAWQ_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CLAWQ_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def one_line(result: Result) -> str:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def clawq(*args: str, env: dict[str, str]) -> Result:
    return CliRunner().invoke(cli.main, list(args), env=env)


def run(tmp_path: Path) -> tuple[str, ...]:
    (tmp_path / "s.json").write_text('{"turns": [{"text": "hi"}]}')
    return ("run", "--script", str(tmp_path / "s.json"), "--workspace", str(tmp_path), "hi")


def test_redis_away_is_one_line(isolated: Isolated, tmp_path: Path) -> None:
    port = free_port()
    env = {**isolated.env(), "CLAWQ_REDIS_URL": f"redis://127.0.0.1:{port}/0"}
    for args in (("status",), run(tmp_path)):
        line = one_line(clawq(*args, env=env))
        assert line.startswith(f"Error: Redis at 127.0.0.1:{port} is unreachable ("), line
        assert line.endswith("start the stack (clawq up) or name it (CLAWQ_REDIS_URL)")


def test_postgres_away_is_one_line(isolated: Isolated, tmp_path: Path) -> None:
    port = free_port()
    env = {**isolated.env(), "CLAWQ_DATABASE_URL": f"postgresql://u:pw@127.0.0.1:{port}/x"}
    for args in (run(tmp_path), ("keys", "list")):
        line = one_line(clawq(*args, env=env))
        assert line.startswith(f"Error: PostgreSQL at 127.0.0.1:{port} is unreachable ("), line
        assert "pw" not in line


def test_a_stale_stack_file_is_one_line_not_other_services(home: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    home.mkdir()
    state = {
        "redis_url": "redis://127.0.0.1:6379/0",  # reachable: it must not be used
        "database_url": "postgresql://postgres@127.0.0.1:5432/test",
        "pid": gone.pid,
        "data": str(home / "data"),
    }
    (home / "stack.json").write_text(json.dumps(state))
    line = one_line(clawq("status", env={}))
    assert line == (
        f"Error: the local stack in {home / 'stack.json'} (pid {gone.pid}) is not running:"
        " start it with `clawq up`, or name the services (CLAWQ_REDIS_URL, CLAWQ_DATABASE_URL)"
    )
