"""`clawq up` as a user runs it, on embedded services in a clawq home of the test's own
(issue 30): its data outlives a restart (keys, custom tools, MCP servers, context files
and memory, jobs and their events), and a second stack is refused at once with the reason
or runs beside the first on data of its own."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from broker.config.settings import Settings
from broker.stores.memory import MemoryStore
from orchestrator.cli.local.embedded import free_port
from orchestrator.client import Client
from tests.integration.conftest import call, script, wait_until

TOOL = {
    "name": "say_hello",
    "description": "Say hello",
    "parameters": {"type": "object", "properties": {}},
    "command": "echo hello",
}


@dataclass
class Home:
    path: Path
    env: dict[str, str]

    def clawq(
        self, *args: str, stdin: str = "", timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", *args],
            env=self.env,
            cwd=self.path,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def up(
        self, *args: str, env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.path / f"up-{time.monotonic_ns()}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.cli", "up", *args],
                env=self.env if env is None else env,
                cwd=self.path,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # as a shell starts it: a process group of its own
            )
        return proc, log


@pytest.fixture
def home() -> Iterator[Home]:
    """A clawq home of the test's own, outside pytest's temporary folders: the embedded
    PostgreSQL runs as its own user (we are root), which must reach its data, and a
    pytest session starting on this machine closes /tmp/pytest-of-root to all but root.
    The API on a free port: another stack on this machine may hold 8420."""
    root = Path(tempfile.mkdtemp(prefix="clawq-home-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAWQ_")}
    env |= {
        "CLAWQ_HOME": str(root / "home"),
        "CLAWQ_WORKSPACE_ROOT": str(root),
        "CLAWQ_API_PORT": str(free_port()),
    }
    try:
        yield Home(root, env)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def until_up(proc: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> str:
    """The stack's output once it says it is up (it fails the test if it exits first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if "stack up" in text:
            return text
        assert proc.poll() is None, text[-3000:]
        time.sleep(0.3)
    raise AssertionError(f"not up within {timeout}s: {log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
    proc.wait(timeout)


def client_of(home: Home, data: Path | None = None) -> Client:
    state = json.loads(((data or home.path / "home" / "data") / "stack.json").read_text())
    return Client(Settings(redis_url=state["redis_url"], database_url=state["database_url"]))


def clawq_processes(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """`clawq up` and every process it started (the embedded services are not Python)."""
    root = psutil.Process(proc.pid)
    return [p for p in [root, *root.children(recursive=True)] if p.name().startswith("python")]


def quiet(text: str, home: Home) -> None:
    """One line per process started, the state, the stack's line: no banner, no warning
    per process; the superuser warning explained once; the processes' output in the log."""
    lines = text.strip().splitlines()
    assert len(lines) <= 12, text
    allowed = ("started ", "data: ", "running as root: ", "stack up: ")
    assert all(line.startswith(allowed) for line in lines), text
    assert sum(line.startswith("started ") for line in lines) == 2 + 6  # services, processes
    assert "SecurityWarning" not in text and "celery@" not in text
    logged = (home.path / "home" / "data" / "up.log").read_text()
    assert "[tasks]" in logged  # Celery's banners went there


@pytest.mark.timeout(600)
def test_a_restarted_stack_keeps_every_kind_of_state(home: Home) -> None:
    proc, log = home.up()
    try:
        quiet(until_up(proc, log), home)
        running = clawq_processes(proc)  # named on a failure: CI once found a twelfth
        assert len(running) < 12, [" ".join(p.cmdline()[1:6]) for p in running]
        key = home.clawq("keys", "create", "--user", "ann")
        assert key.returncode == 0, key.stderr
        assert home.clawq("tools", "add", json.dumps(TOOL)).returncode == 0
        added = home.clawq("mcp", "add", '{"mcpServers": {"t": {"command": "mcp-server-time"}}}')
        assert added.returncode == 0, added.stderr
        soul = home.clawq("context", "set", "main", "SOUL.md", "-", stdin="Be brief.\n")
        assert soul.returncode == 0, soul.stderr
        remember = call("m", "write_file", path="MEMORY.md", content="- ann likes tea\n")
        (home.path / "s.json").write_text(
            json.dumps(script({"tool_calls": [remember]}, {"text": "remembered"}))
        )
        ran = home.clawq("run", "--json", "--script", "s.json", "hello")
        assert ran.returncode == 0, ran.stderr
        job_id = json.loads(ran.stdout)["job_id"]
    finally:
        stop(proc)

    proc, log = home.up()
    try:
        until_up(proc, log)
        keys = json.loads(home.clawq("keys", "list", "--json").stdout)
        assert [k["user_id"] for k in keys] == ["ann"]
        tools = json.loads(home.clawq("tools", "list", "--json").stdout)
        assert [t["name"] for t in tools] == ["say_hello"]
        servers = json.loads(home.clawq("mcp", "list", "--json").stdout)
        assert [s["name"] for s in servers] == ["t"]
        assert home.clawq("context", "show", "main", "SOUL.md").stdout == "Be brief.\n"
        client = client_of(home)
        try:
            (memory,) = MemoryStore(client.store.conn).documents("main")
            assert memory.content == "- ann likes tea\n"
            job = client.job(job_id)
            assert job.wait(timeout=10).final_text == "remembered"
            assert "job_finished" in [e.type for e in job.events()]  # Redis was saved too
        finally:
            client.close()
    finally:
        stop(proc)


def holding_a_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


@pytest.mark.timeout(600)
def test_a_second_stack_is_refused_at_once_or_runs_beside_with_its_own_data(home: Home) -> None:
    first, log = home.up()
    try:
        until_up(first, log)
        started = time.monotonic()
        again = home.clawq("up", timeout=30)
        lines = again.stderr.strip().splitlines()
        assert again.returncode == 1 and len(lines) == 1, again.stderr
        assert lines[0].startswith(f"Error: another clawq up (pid {first.pid}) runs on ")
        assert time.monotonic() - started < 15  # at once, not after a minute of retries
        with holding_a_port() as taken:
            port = taken.getsockname()[1]
            busy = subprocess.run(
                [sys.executable, "-m", "orchestrator.cli", "up", "--data", str(home.path / "b")],
                env={**home.env, "CLAWQ_API_PORT": str(port)},
                cwd=home.path,
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert busy.returncode == 1, busy.stderr
            assert busy.stderr.strip() == (
                f"Error: port {port} on 127.0.0.1 is taken: stop what holds it, or set"
                " CLAWQ_API_PORT (api_port in clawq.toml)"
            )
        # beside it, on data of its own: another API port, reached with CLAWQ_DATA
        moved = {k: v for k, v in home.env.items() if k != "CLAWQ_API_PORT"}  # the default
        second, second_log = home.up("--data", str(home.path / "second"), env=moved)
        try:
            text = until_up(second, second_log)
            assert f"CLAWQ_DATA={home.path / 'second'}" in text
            status = home.clawq("status", "--json")
            beside = subprocess.run(
                [sys.executable, "-m", "orchestrator.cli", "status", "--json"],
                env={**home.env, "CLAWQ_DATA": str(home.path / "second")},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert status.returncode == 0 and beside.returncode == 0, beside.stderr
            assert status.stdout != beside.stdout  # two clusters, each its own processes
            main = json.loads((home.path / "home" / "stack.json").read_text())
            assert main["pid"] == first.pid  # the first stays the one commands use
        finally:
            stop(second)
    finally:
        stop(first)
    wait_until(lambda: not (home.path / "home" / "stack.json").exists(), 10, "state removed")


@pytest.mark.timeout(300)
def test_the_demo_prints_its_processes_and_the_agent_trace_only(home: Home) -> None:
    done = home.clawq("demo", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = (done.stdout + done.stderr).splitlines()
    assert len(out) < 40, "\n".join(out)  # it was ~1,140 lines
    assert sum(line.startswith("started ") for line in out) == 2 + 6
    assert any(line.startswith("model: ") for line in out)  # the agent's trace
    assert done.stdout.splitlines()[-1].startswith("demo completed")
    assert not any("celery@" in line or "Warning" in line for line in out), "\n".join(out)


@pytest.mark.timeout(300)
def test_ctrl_c_with_a_call_running_stops_in_order_and_the_watcher_says_one_line(
    home: Home,
) -> None:
    proc, log = home.up()
    try:
        until_up(proc, log)
        sleeper = call("s", "exec", command="sleep 30")
        (home.path / "s.json").write_text(json.dumps(script({"tool_calls": [sleeper]})))
        watcher = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--allow", "exec", "--script",
             "s.json", "sleep"],
            env=home.env,
            cwd=home.path,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert watcher.stderr is not None
        while "→ exec" not in (line := watcher.stderr.readline()):  # the call was sent
            assert line, "clawq run ended before the call was sent"
        time.sleep(1.0)  # it runs
    finally:
        stop(proc)  # Ctrl-C on `clawq up`
    assert proc.returncode == 0
    _, rest = watcher.communicate(timeout=60)
    assert watcher.returncode == 1
    assert "Traceback" not in rest, rest
    last = rest.strip().splitlines()[-1]  # after the trace, one line
    assert last.startswith("Error: the stack went away while job "), rest
    assert last.endswith("the job goes on when it is back (clawq up)")
    text = log.read_text()
    assert "stopping: the workers, the orchestrator and the API, then the services" in text
    logged = (home.path / "home" / "data" / "up.log").read_text()
    assert "Traceback" not in logged, logged[-3000:]  # nothing lost its services under it
