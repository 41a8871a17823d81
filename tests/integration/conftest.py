"""A real cluster per test module: an orchestrator process and Celery worker processes on
the system Redis and PostgreSQL, in a Redis db and schema of the module's own."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.config.settings import Settings
from orchestrator.cli.local.stack import Stack
from orchestrator.client import Client
from tests.conftest import Isolated
from workers.tools.runtime.process import end_session


def call(call_id: str, name: str, **input_: object) -> dict[str, Any]:
    """One tool call in a scripted model's turn."""
    return {"id": call_id, "name": name, "input": input_}


def script(*turns: dict[str, Any]) -> dict[str, Any]:
    """A scripted model: each turn is its next reply."""
    return {"turns": list(turns)}


def wait_until(check: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    """Poll `check` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what or 'not'} within {timeout}s")


@dataclass
class Cluster:
    iso: Isolated
    stack: Stack
    client: Client
    env: dict[str, str]  # what the cluster's processes were started with


def start_cluster(
    workers_per_group: int = 1,
    groups: tuple[str, ...] = ("fs", "runtime"),
    orchestrators: int = 1,
    concurrency: int = 2,
    **overrides: object,
) -> Iterator[Cluster]:
    # the tests' workspaces lie in pytest's temp dirs: a root every user of a test cluster
    # may use, unless the test sets its own ceilings
    overrides = {
        "workspace_root": tempfile.mkdtemp(prefix="clawq-ws-"),
        "process_state_dir": tempfile.mkdtemp(prefix="clawq-procs-"),  # ended below
        "user_ceilings": {"*": {"workspace_roots": [tempfile.gettempdir()]}},
        **overrides,
    }
    iso = Isolated(**overrides)
    env = iso.env() | {
        f"CLAWQ_{k.upper()}": json.dumps(v) if isinstance(v, dict | list) else str(v)
        for k, v in overrides.items()
    }
    stack = Stack(
        list(groups),
        workers_per_group,
        env=env,
        concurrency=concurrency,
        orchestrators=orchestrators,
    )
    stack.start()
    try:
        stack.wait_ready(iso.redis_url)
        client = Client(iso.settings)
        yield Cluster(iso, stack, client, env)
        client.close()
    finally:
        stack.stop()
        end_processes(iso.settings)
        iso.drop()


def end_processes(settings: Settings) -> None:
    """Kill the background processes the cluster's sessions left: its workers, which end a
    session's processes once its job has ended, are gone, and no later cluster sees them."""
    root = Path(settings.process_state_dir)
    for session in root.iterdir() if root.exists() else []:
        end_session(settings, session.name)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(approval_timeout_s=2)


def serve_api(cluster: Cluster) -> Iterator[str]:
    """`clawq api` on a free port for a cluster; yields its URL."""
    import os
    import socket
    import subprocess
    import sys

    import httpx

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, **cluster.env}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "api",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(healthy, timeout=30, what="the API")
        yield url
    finally:
        proc.terminate()
        proc.wait(15)
