"""Live output of what runs outside a job's calls, over the real stack: a background
process's output comes from its supervisor as `tool_output_delta` events of the job that
started it (scrubbed, capped, while it runs), whatever Redis does to the supervisor; an MCP
server's progress reaches `job.stream()` as `ToolProgress` and `clawq run --live`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.config.secretbox import new_key
from broker.stores.api_keys import ApiKeyStore
from orchestrator.client import Client
from orchestrator.client.deltas import JobEnded, ToolOutputDelta, ToolProgress
from tests.integration.conftest import (
    Cluster,
    call,
    script,
    serve_api,
    start_cluster,
    wait_until,
)
from workers.tools.runtime.process_live import REDIS_ENV, SECRETS_ENV, LiveSpec

LITERAL = "brv-literal-4242"  # a secret of the worker's own settings (brave_api_key)
KEY_TAIL = "Ab3dE" * 19 + "AA"  # an Anthropic key's, after its prefix
# p1..p3 0.4 s apart, then two secrets, each written in pieces (never whole in the command)
TIMED = (
    "for i in 1 2 3; do echo p$i; sleep 0.4; done; "
    f"printf 'key sk-ant-api03-'; sleep 0.2; echo {KEY_TAIL}; printf 'brv-lit'; echo eral-4242; "
    "touch s1.done"
)
# the job waits for its background process to end (and its last deltas to go)
WAIT = "while [ ! -e s1.done ]; do sleep 0.1; done; sleep 0.5"
SEQ = "".join(f"{n}\n" for n in range(1, 3001))
STEPS = "mcp_py__steps"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    for cluster in start_cluster(
        groups=("runtime", "mcp"),
        tool_output_stream_max_bytes=2000,
        brave_api_key=LITERAL,
        secret_key=new_key(),
        mcp_health_interval_s=1,
    ):
        ours = {"command": sys.executable, "args": ["-m", "tests.mcp_servers.web_server", "stdio"]}
        cluster.client.mcp.add({"mcpServers": {"py": ours}})
        cluster.client.mcp.grant("py", agent="main", by="test")
        wait_until(
            lambda c=cluster: STEPS in {t.exposed_name for t in c.client.mcp.tools()},
            what="the catalog",
        )
        yield cluster


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Iterator[str]:
    yield from serve_api(cluster)


def test_a_background_process_streams_to_its_job(cluster: Cluster, workspace: Path) -> None:
    """Its output comes as deltas of the `start` call while it runs, scrubbed by the
    worker's scrubber (its own literal secrets too), capped per call."""
    job = cluster.client.submit(
        "serve",
        workspace=str(workspace),
        allow=["process", "exec"],
        script=script(
            {"tool_calls": [call("s1", "process", action="start", command=TIMED)]},
            {"tool_calls": [call("s2", "process", action="start", command="seq 3000")]},
            {"tool_calls": [call("wait", "exec", command=WAIT)]},
            {"text": "done"},
        ),
    )
    result = job.wait(timeout=60)
    assert result.status == "completed", result
    calls = {c.id: c for c in result.tool_calls}
    assert not any(c.is_error for c in calls.values()), calls
    events = list(job.events())
    timed = [e for e in events if e.type == "tool_output_delta" and e.data["call_id"] == "s1"]
    first_id = calls["s1"].output.split()[1].rstrip(":")  # "started <id>: …"
    assert {(e.data["name"], e.data["process"]) for e in timed} == {("process", first_id)}
    shown = "".join(e.data["text"] for e in timed)
    assert shown.startswith("p1\np2\np3\n"), shown
    assert shown.count("[REDACTED]") == 2, shown  # the key, and the worker's literal secret
    assert KEY_TAIL not in shown and "sk-ant" not in shown and "eral-4242" not in shown
    when = {line: next(e.at for e in timed if line in e.data["text"]) for line in ("p1", "p3")}
    assert when["p3"] - when["p1"] > 0.5  # as it ran (0.8 s apart), not at its end
    print(f"\nprocess: p1 → p3 {when['p3'] - when['p1']:.2f} s apart (0.8 s in the command)")
    loud = [e.data for e in events if e.type == "tool_output_delta" and e.data["call_id"] == "s2"]
    assert sum(len(d["text"]) for d in loud) == 2000 and loud[-1].get("truncated")
    assert "".join(d["text"] for d in loud) == SEQ[:2000]  # in order, from the start
    items = [d for d in job.stream() if isinstance(d, ToolOutputDelta) and d.call_id == "s1"]
    assert "".join(d.text for d in items) == shown and items[0].process == first_id


@pytest.mark.parametrize("redis_is", ["refusing", "silent", "malformed"])
def test_a_redis_failure_loses_deltas_never_the_process(tmp_path: Path, redis_is: str) -> None:
    """The supervisor alone, told a Redis URL that refuses, never answers, or does not
    parse: the command runs, its output file is whole, its exit code is written at once."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections complete in the backlog; nothing ever answers
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        refusing = probe.getsockname()[1]  # closed once this block ends
    url = {
        "refusing": f"redis://127.0.0.1:{refusing}/0",
        "silent": f"redis://127.0.0.1:{silent.getsockname()[1]}/0",
        "malformed": "redis://:pw@127.0.0.1:notaport/0",
    }[redis_is]
    state = tmp_path / "proc"
    state.mkdir()
    (state / "cmd").write_text("seq 3")
    (state / "cwd").write_text(str(tmp_path))
    (state / "argv").write_text(
        json.dumps(["sh", "-c", "seq 3; env | grep -c CLAWQ_PROCSUP || true"])
    )
    spec = LiveSpec(
        job_id="j-redis",
        call_id="c",
        process="p",
        stream_delta_interval_ms=10,
        stream_delta_max_chars=200,
        tool_output_stream_max_bytes=1000,
        events_ttl_s=60,
    )
    (state / "live.json").write_text(spec.model_dump_json())
    env = {**os.environ, REDIS_ENV: url, SECRETS_ENV: json.dumps([LITERAL])}
    started = time.monotonic()
    argv = [sys.executable, "-m", "workers.tools.runtime.procsup", str(state), "100000"]
    with silent, subprocess.Popen(argv, env=env, stderr=subprocess.PIPE) as proc:
        code = wait_until(lambda: (state / "code").exists() and time.monotonic(), timeout=20)
        assert code - started < 4  # not held by the Redis that never answers (5 s timeout)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err.decode()
    assert (state / "code").read_text() == "0"
    # its whole output; and the command never saw the URL or the secrets
    assert (state / "out").read_text() == "1\n2\n3\n0\n"


@pytest.mark.parametrize("remote", [False, True])
def test_mcp_progress_reaches_job_stream(
    cluster: Cluster, workspace: Path, remote: bool, request: pytest.FixtureRequest
) -> None:
    """Each progress notification is a `ToolProgress` of `job.stream()` (local, or over
    SSE), in order and before the job's end; the `tool_call_progress` event is as it was."""
    client = cluster.client
    if remote:
        key = ApiKeyStore(cluster.client.store).create("alice", admin=True)[1]
        client = Client(api_url=request.getfixturevalue("api"), api_key=key)
    job = client.submit(
        "work",
        workspace=str(workspace),
        script=script(
            {"tool_calls": [call("m1", STEPS, count=3, interval=0.3)]},
            {"text": "done"},
        ),
    )
    items = list(job.stream())
    progress = [d for d in items if isinstance(d, ToolProgress)]
    assert [(p.call_id, p.name, p.progress, p.total, p.message) for p in progress] == [
        ("m1", STEPS, float(n), 3.0, f"step {n}") for n in (1, 2, 3)
    ]
    assert isinstance(items[-1], JobEnded) and items[-1].status == "completed"
    raw = [e.data for e in job.events() if e.type == "tool_call_progress"]
    assert raw == [
        {"call_id": "m1", "name": STEPS, "progress": n, "total": 3, "message": f"step {n}"}
        for n in (1, 2, 3)
    ]
    if remote:
        client.close()


def test_an_mcp_servers_progress_message_is_scrubbed(cluster: Cluster, workspace: Path) -> None:
    """A server's progress message passes the worker's scrubber, as its result does: a key
    it echoes never reaches the job's events."""
    token = "ghp_" + "q" * 36
    job = cluster.client.submit(
        "work",
        workspace=str(workspace),
        script=script(
            {"tool_calls": [call("m1", STEPS, count=2, interval=0.1, label=f"using {token}")]},
            {"text": "done"},
        ),
    )
    progress = [d for d in job.stream() if isinstance(d, ToolProgress)]
    assert [p.progress for p in progress] == [1.0, 2.0]
    assert all(p.message.startswith("using ") for p in progress), progress
    raw = [e.data for e in job.events() if e.type == "tool_call_progress"]
    assert len(raw) == 2 and token not in json.dumps(raw)  # (the call's input has it)


def test_clawq_run_live_shows_progress_and_process_output(cluster: Cluster, tmp_path: Path) -> None:
    plan = script(
        {"tool_calls": [call("m1", STEPS, count=2, interval=0.2)]},
        {
            "tool_calls": [
                call("s1", "process", action="start", command="echo one; echo two; touch s1.done")
            ]
        },
        {"tool_calls": [call("wait", "exec", command=WAIT)]},
        {"text": "ok"},
    )
    (tmp_path / "script.json").write_text(json.dumps(plan))
    done = subprocess.run(
        [
            *(sys.executable, "-m", "orchestrator.cli", "run", "--live"),
            *("--allow", "process", "--allow", "exec", "--script", str(tmp_path / "script.json")),
            *("--workspace", str(tmp_path), "go"),
        ],
        env={**os.environ, **cluster.env},
        capture_output=True,
        timeout=60,
    )
    said = done.stderr.decode()
    assert done.returncode == 0, said
    shown = [line for line in said.splitlines() if line.startswith(("  … ", "  │ "))]
    assert shown == [
        f"  … {STEPS} 1/2 step 1",
        f"  … {STEPS} 2/2 step 2",
        "  │ one",
        "  │ two",
    ], said
    assert said.index("step 2") < said.index(f"✓ {STEPS}")
