"""exec in the Docker sandbox, against a real Docker-API engine (podman in CI): the command
runs in a container, not on the host, as a non-root user, with no network, within limits;
containers are reused per key and cleaned up; any sandbox error fails the call."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from broker.config.settings import Settings
from broker.protocol import CallContext
from tests.container_engine import EngineUnavailable, docker_url, ensure_image
from workers.confine.sandbox import LABEL, Sandbox
from workers.execute import run_tool
from workers.registry import default_registry
from workers.tool import ToolContext, ToolResult

REGISTRY = default_registry()


def interfaces(result: ToolResult) -> list[str]:
    lines = result.for_llm.split("[exit code")[0].split()
    return sorted(lines)


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[str, str]]:
    try:
        url = docker_url()
        image = ensure_image(url)
    except EngineUnavailable as exc:  # never a skip: `make test` installs podman
        pytest.fail(f"the sandbox tests need a Docker-API engine (podman): {exc}")
    yield url, image
    client = docker.DockerClient(base_url=url)
    for ctr in client.containers.list(all=True, filters={"label": LABEL}):
        ctr.remove(force=True)
    client.close()


@pytest.fixture
def settings(engine: tuple[str, str]) -> Settings:
    url, image = engine
    return Settings(
        sandbox_enabled=True,
        sandbox_docker_url=url,
        sandbox_image=image,
        sandbox_memory="128m",
        sandbox_pids=64,
    )


@pytest.fixture
def make_sandbox() -> Iterator[Callable[[Settings], Sandbox]]:
    made: list[Sandbox] = []

    def make(settings: Settings) -> Sandbox:
        made.append(Sandbox(settings))
        return made[-1]

    yield make
    for sandbox in made:
        sandbox.close()


@pytest.fixture
def sandbox_ws(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, 65534, 65534)  # owned by the sandbox user, as a deployment would
    return ws


def exec_call(
    settings: Settings, sandbox: Sandbox | None, ws: Path, key: str, **args: Any
) -> ToolResult:
    ctx = ToolContext(
        CallContext(workspace=str(ws), sandbox_key=key), settings, job_id="j", sandbox=sandbox
    )
    return run_tool(REGISTRY, "exec", args, ctx)


def test_runs_in_a_container_not_on_the_host(
    make_sandbox: Callable[[Settings], Sandbox],
    settings: Settings,
    sandbox_ws: Path,
    tmp_path: Path,
) -> None:
    host_marker = tmp_path / "host-only"
    host_marker.write_text("x")
    sandbox = make_sandbox(settings)
    result = exec_call(
        settings,
        sandbox,
        sandbox_ws,
        "k-host",
        command=f"id -u; cat /etc/passwd | wc -l; ls {host_marker} || true; "
        "echo made > made.txt; pwd",
    )
    lines = result.for_llm.splitlines()
    assert lines[0] == "65534" and lines[1] == "2"  # non-root, the image's two users
    assert "No such file" in result.for_llm  # the host's files are not there
    assert "/workspace" in lines and (sandbox_ws / "made.txt").read_text() == "made\n"
    assert result.metadata["where"].startswith("sandbox clawq-sbx-")


def test_no_network_and_limits(
    make_sandbox: Callable[[Settings], Sandbox],
    settings: Settings,
    sandbox_ws: Path,
    engine: tuple[str, str],
) -> None:
    sandbox = make_sandbox(settings)
    # the network interfaces the command sees (busybox-static's wget cannot resolve, even an
    # address literal, so connecting out is no probe): loopback alone is no network
    probe = "cut -d: -f1 /proc/net/dev | tail -n +3"
    net = exec_call(settings, sandbox, sandbox_ws, "k-limits", command=probe)
    assert interfaces(net) == ["lo"], net.for_llm
    # the same probe with the host's network sees the host's interfaces: it tells the two
    hosted = settings.model_copy(update={"sandbox_network": "host"})
    reached = exec_call(hosted, make_sandbox(hosted), sandbox_ws, "k-net-host", command=probe)
    assert set(interfaces(reached)) - {"lo"}, reached.for_llm
    forks = exec_call(
        settings,
        sandbox,
        sandbox_ws,
        "k-limits",
        command="for i in $(seq 100); do sleep 5 & done 2>&1 | tail -1; echo end",
    )
    assert "can't fork" in forks.for_llm or "Resource temporarily unavailable" in forks.for_llm
    client = docker.DockerClient(base_url=engine[0])
    (ctr,) = [c for c in client.containers.list(filters={"label": f"{LABEL}=k-limits"})]
    host = ctr.attrs["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["Memory"] == 128 * 1024 * 1024 and host["PidsLimit"] == 64
    assert host["NanoCpus"] == 1_000_000_000
    client.close()


def test_containers_are_reused_per_key_and_removed_when_idle(
    make_sandbox: Callable[[Settings], Sandbox],
    settings: Settings,
    sandbox_ws: Path,
    engine: tuple[str, str],
) -> None:
    sandbox = make_sandbox(settings)
    first = exec_call(settings, sandbox, sandbox_ws, "k-a", command="hostname")
    again = exec_call(settings, sandbox, sandbox_ws, "k-a", command="hostname")
    other = exec_call(settings, sandbox, sandbox_ws, "k-b", command="hostname")
    assert first.for_llm == again.for_llm != other.for_llm
    assert first.metadata["where"] == again.metadata["where"] != other.metadata["where"]
    name_a = first.metadata["where"].split()[1]
    removed = sandbox.reap(lambda name: name != name_a)  # only k-a is idle
    assert removed == [name_a]
    client = docker.DockerClient(base_url=engine[0])
    names = {c.name for c in client.containers.list(all=True, filters={"label": LABEL})}
    assert name_a not in names and other.metadata["where"].split()[1] in names
    client.close()


def test_timeout_kills_the_command_and_its_children(
    make_sandbox: Callable[[Settings], Sandbox], settings: Settings, sandbox_ws: Path
) -> None:
    sandbox = make_sandbox(settings)
    started = time.monotonic()
    result = exec_call(
        settings,
        sandbox,
        sandbox_ws,
        "k-timeout",
        command="sleep 30 & sleep 30; touch late",
        timeout_s=1,
    )
    assert time.monotonic() - started < 10
    assert result.is_error and "timed out after 1s" in result.for_llm
    left = exec_call(settings, sandbox, sandbox_ws, "k-timeout", command="ps")
    assert "sleep 30" not in left.for_llm and not (sandbox_ws / "late").exists()


def test_sandbox_errors_fail_closed(
    make_sandbox: Callable[[Settings], Sandbox], sandbox_ws: Path, tmp_path: Path
) -> None:
    broken = Settings(sandbox_enabled=True, sandbox_docker_url="unix:///nonexistent.sock")
    marker = tmp_path / "ran-on-host"
    result = exec_call(broken, make_sandbox(broken), sandbox_ws, "k-x", command=f"touch {marker}")
    assert result.is_error and result.for_llm.startswith("sandbox error, command not run")
    assert not marker.exists()
    missing = exec_call(broken, None, sandbox_ws, "k-x", command=f"touch {marker}")
    assert missing.is_error and not marker.exists()


def test_missing_image_fails_closed(
    make_sandbox: Callable[[Settings], Sandbox],
    settings: Settings,
    sandbox_ws: Path,
    tmp_path: Path,
) -> None:
    bad = settings.model_copy(update={"sandbox_image": "localhost/no-such-image:1"})
    result = exec_call(bad, make_sandbox(bad), sandbox_ws, "k-noimage", command="true")
    assert result.is_error and "sandbox" in result.for_llm


def test_a_job_runs_its_commands_in_the_sandbox(
    engine: tuple[str, str], sandbox_ws: Path, tmp_path: Path
) -> None:
    from tests.integration.conftest import start_cluster

    url, image = engine
    marker = tmp_path / "host-marker"
    cluster_iter = start_cluster(sandbox_enabled=True, sandbox_docker_url=url, sandbox_image=image)
    cluster = next(cluster_iter)
    try:
        job = cluster.client.submit(
            "in the box",
            workspace=str(sandbox_ws),
            allow=["exec"],
            script={
                "turns": [
                    {
                        "tool_calls": [
                            {
                                "id": "x",
                                "name": "exec",
                                "input": {
                                    "command": f"id -u; touch {marker} || true; echo in > box.txt"
                                },
                            }
                        ]
                    },
                    {"text": "done"},
                ]
            },
        )
        (call,) = job.wait(timeout=60).tool_calls
        assert call.output.startswith("65534\n") and not marker.exists()
        assert (sandbox_ws / "box.txt").read_text() == "in\n"
    finally:
        next(cluster_iter, None)


def test_background_processes_run_in_the_sandbox(
    make_sandbox: Callable[[Settings], Sandbox],
    settings: Settings,
    sandbox_ws: Path,
    tmp_path: Path,
) -> None:
    from workers.tools.runtime.process import end_session

    settings = settings.model_copy(update={"process_state_dir": str(tmp_path / "procs")})
    sandbox = make_sandbox(settings)

    def process(**args: Any) -> ToolResult:
        ctx = ToolContext(
            CallContext(workspace=str(sandbox_ws), sandbox_key="k-proc"),
            settings,
            job_id="j",
            session_id="sess",
            sandbox=sandbox,
        )
        return run_tool(REGISTRY, "process", args, ctx)

    def read_until(pid: str, needle: str) -> str:
        seen = ""
        for _ in range(100):
            seen += process(action="read", id=pid).for_llm
            if needle in seen:
                return seen
            time.sleep(0.05)
        raise AssertionError(f"{needle!r} not in {seen!r}")

    pid = process(action="start", command="id -u; while read l; do echo got:$l; done").metadata[
        "id"
    ]
    assert not process(action="write", id=pid, input="ping\n").is_error
    text = read_until(pid, "got:ping")
    assert "65534\ngot:ping" in text  # the sandbox user: it runs in the container
    assert "sent SIGKILL" in process(action="signal", id=pid, signal="KILL").for_llm
    assert "[exited" in read_until(pid, "[exited")
    process(action="start", command="sleep 300")
    assert end_session(settings, "sess", sandbox) == 1
    left = exec_call(settings, sandbox, sandbox_ws, "k-proc", command="ps")
    assert "sleep 300" not in left.for_llm


@pytest.fixture(scope="module")
def sandboxed(engine: tuple[str, str]) -> Iterator[Any]:
    """A cluster whose runtime worker runs commands in the sandbox."""
    from tests.integration.conftest import start_cluster

    url, image = engine
    yield from start_cluster(
        groups=("runtime",),
        sandbox_enabled=True,
        sandbox_docker_url=url,
        sandbox_image=image,
        tool_output_stream_max_bytes=2000,
    )


def test_a_sandboxed_commands_output_streams_while_it_runs(
    sandboxed: Any, sandbox_ws: Path
) -> None:
    """The attach stream is read as it comes: its lines are `tool_output_delta` events
    before the call ends, in order, adding up to the result's output; capped per call."""
    from tests.integration.conftest import call, script

    slow = "id -u; for i in 1 2 3; do echo line$i; sleep 0.3; done; echo oops >&2"
    job = sandboxed.client.submit(
        "stream",
        workspace=str(sandbox_ws),
        allow=["exec"],
        script=script(
            {"tool_calls": [call("c1", "exec", command=slow)]},
            {"tool_calls": [call("c2", "exec", command="seq 1000")]},
            {"text": "done"},
        ),
    )
    result = job.wait(timeout=60)
    assert result.status == "completed", result
    events = list(job.events())
    out = [e for e in events if e.type == "tool_output_delta" and e.data["call_id"] == "c1"]
    said = {
        s: "".join(e.data["text"] for e in out if e.data["stream"] == s)
        for s in ("stdout", "stderr")
    }
    # the sandbox user's id: it ran in the container
    assert said == {"stdout": "65534\nline1\nline2\nline3\n", "stderr": "oops\n"}
    stdout = [e.data for e in out if e.data["stream"] == "stdout"]
    assert [d["offset"] for d in stdout] == [
        sum(len(x["text"]) for x in stdout[:i]) for i in range(len(stdout))
    ]
    assert len(stdout) >= 3  # line by line, as they came
    finished = next(
        e for e in events if e.type == "tool_call_finished" and e.data["call_id"] == "c1"
    )
    assert finished.at - out[0].at > 0.4  # the first line came while it ran (0.9 s)
    print(
        f"\nsandbox: first line {finished.at - out[0].at:.2f} s before the call ended, "
        f"{len(out)} deltas"
    )
    record = next(c for c in result.tool_calls if c.id == "c1")
    assert record.output == said["stdout"] + "[stderr]\n" + said["stderr"] + "[exit code 0]"
    big = [e.data for e in events if e.type == "tool_output_delta" and e.data["call_id"] == "c2"]
    assert sum(len(d["text"]) for d in big) == 2000 and big[-1].get("truncated")
    assert "\n1000\n" in next(c for c in result.tool_calls if c.id == "c2").output


# the job waits for its background process to end (and its last deltas to go)
WAIT = "while [ ! -e {} ]; do sleep 0.1; done; sleep 0.5"


def test_a_sandboxed_background_process_streams_to_its_job(
    sandboxed: Any, sandbox_ws: Path
) -> None:
    """Its supervisor reads the attach stream as it comes: the output is deltas of the
    `start` call while the process runs, stdout and stderr apart."""
    from tests.integration.conftest import call, script

    command = "id -u; for i in 1 2 3; do echo p$i; sleep 0.4; done; echo err >&2; touch p.done"
    job = sandboxed.client.submit(
        "serve",
        workspace=str(sandbox_ws),
        allow=["process", "exec"],
        script=script(
            {"tool_calls": [call("s1", "process", action="start", command=command)]},
            {"tool_calls": [call("wait", "exec", command=WAIT.format("p.done"))]},
            {"text": "done"},
        ),
    )
    result = job.wait(timeout=60)
    assert result.status == "completed", result
    out = [e for e in job.events() if e.type == "tool_output_delta"]
    assert {(e.data["call_id"], e.data["name"]) for e in out} == {("s1", "process")}
    said = {
        s: "".join(e.data["text"] for e in out if e.data["stream"] == s)
        for s in ("stdout", "stderr")
    }
    assert said == {"stdout": "65534\np1\np2\np3\n", "stderr": "err\n"}  # in the container
    when = {line: next(e.at for e in out if line in e.data["text"]) for line in ("p1", "p3")}
    assert when["p3"] - when["p1"] > 0.5  # as it ran (0.8 s apart)
    print(
        f"\nsandboxed process: p1 → p3 {when['p3'] - when['p1']:.2f} s apart (0.8 s in the command)"
    )
