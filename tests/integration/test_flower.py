"""Flower shows the subagent tree: `clawq flower` on the cluster, opened in a real headless
Chromium (Debian's package). The screenshot is kept in test-artifacts/."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import Cluster, call, script, start_cluster

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(groups=("fs", "sessions"))


@pytest.fixture
def flower(cluster: Cluster) -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "flower", "--port", str(port)],
        env={**os.environ, **cluster.env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthcheck", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, "flower exited"
            assert time.monotonic() < deadline, "flower did not start"
            time.sleep(0.2)
        time.sleep(1.0)  # its event receiver is connected a moment after the web server
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def chromium(*args: str) -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "Debian's chromium package is needed (.ci/run installs it)"
    done = subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_flower_shows_a_subagent_with_its_parent(
    cluster: Cluster, flower: str, workspace: Path
) -> None:
    parent = cluster.client.submit(
        "delegate",
        workspace=str(workspace),
        script={
            "turns": [
                {"tool_calls": [call("s", "sessions_spawn", task="look around", label="scout")]},
                {"text": "delegated"},
            ],
            "subagents": {"scout": script({"text": "nothing here"})},
            "on_announce": script({"text": "thanks"}),
        },
    )
    parent.wait(timeout=60)
    child = parent.subagents()[0]
    page = f"{flower}/task/{child.id}"
    deadline = time.monotonic() + 30
    while httpx.get(page, timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "flower never saw the subagent's run"
        time.sleep(0.5)
    time.sleep(1.0)  # the succeeded event too

    dom = chromium("--dump-dom", page)
    assert "clawq.agent_run" in dom
    assert "'label': 'scout'" in dom and "'depth': 1" in dom
    assert f"/task/{parent.id}" in dom  # the parent is a link on the child's page
    assert "SUCCESS" in dom

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "flower-subagent.png"
    chromium(f"--screenshot={shot}", "--window-size=1280,1400", page)
    assert shot.stat().st_size > 10_000
