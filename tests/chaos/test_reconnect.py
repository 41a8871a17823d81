"""Every long-lived connection comes back when PostgreSQL or Redis does, with no process
restarted: the fs, sessions and memory workers' store connections, the orchestrator's pools,
the API's. While a service is away, `clawq health … --probe ready` says not ready and why,
and the API answers 503 (retryable) at once instead of hanging.

On a Redis and a PostgreSQL of the test's own (tests/chaos/services.py), stopped and
started again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from broker.config.settings import Settings
from broker.pg.store import Store
from broker.stores.api_keys import ApiKeyStore
from orchestrator.cli.local.stack import Stack
from orchestrator.client import Client
from tests.chaos.services import OwnPostgres, OwnRedis, free_port
from tests.integration.conftest import call, script, wait_until

pytestmark = pytest.mark.timeout(240)


@dataclass
class Services:
    redis: OwnRedis
    pg: OwnPostgres
    env: dict[str, str]
    client: Client
    api: str
    key: str
    workspace: Path


@pytest.fixture(scope="module")
def services() -> Iterator[Services]:
    own_redis, pg = OwnRedis(), OwnPostgres()
    own_redis.start()
    pg.start()
    root = Path(tempfile.mkdtemp(prefix="clawq-reconnect-"))
    env = {
        "CLAWQ_REDIS_URL": own_redis.url,
        "CLAWQ_DATABASE_URL": pg.url,
        "CLAWQ_SPOOL_DIR": str(root / "spool"),
        "CLAWQ_MEMORY_EMBEDDER": "none",
        "CLAWQ_WORKSPACE_ROOT": str(root),
        "CLAWQ_USER_CEILINGS": json.dumps({"*": {"workspace_roots": [str(root)]}}),
    }
    store = Store(pg.url)
    store.migrate()
    _, key = ApiKeyStore(store).create("alice", admin=True)
    store.close()
    stack = Stack(["fs", "sessions", "memory"], env=env, concurrency=1)
    stack.start()
    port = free_port()
    command = ["api", "--port", str(port), "--log-level", "warning"]
    api = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", *command], env={**os.environ, **env}
    )
    url = f"http://127.0.0.1:{port}"
    client = Client(Settings(redis_url=own_redis.url, database_url=pg.url))
    try:
        stack.wait_ready(own_redis.url, timeout=90)
        wait_until(lambda: _healthy(url), 60, "the API")
        workspace = root / "ws"
        workspace.mkdir()
        yield Services(own_redis, pg, env, client, url, key, workspace)
    finally:
        client.close()
        api.terminate()
        api.wait(15)
        stack.stop()
        own_redis.stop()
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def a_job_using_every_store(s: Services) -> None:
    """A job whose calls each need a worker's PostgreSQL connection: the fs worker (a root
    listing reads the interceptors), the sessions worker, the memory worker."""
    job = s.client.submit(
        "use the stores",
        workspace=str(s.workspace),
        allow=["list_files", "sessions_list", "memory_search"],
        script=script(
            {
                "tool_calls": [
                    call("ls", "list_files", path="."),
                    call("sl", "sessions_list"),
                    call("ms", "memory_search", query="anything"),
                ]
            },
            {"text": "done"},
        ),
    )
    result = job.wait(timeout=60)
    assert result.status == "completed", result.error
    errors = {c.name: c.output[:200] for c in result.tool_calls if c.is_error}
    assert errors == {}


def api_get(s: Services) -> httpx.Response:
    return httpx.get(
        f"{s.api}/v1/sessions/none", headers={"Authorization": f"Bearer {s.key}"}, timeout=30
    )


def probe(s: Services) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "health", "orchestrator", "--probe", "ready"],
        env={**os.environ, **s.env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_after_a_postgres_restart_every_store_connection_comes_back(s: Services) -> None:
    a_job_using_every_store(s)
    s.pg.crash()
    try:
        down = probe(s)
        assert down.returncode == 1 and "postgresql unreachable at 127.0.0.1" in down.stderr
        started = time.monotonic()
        refused = api_get(s)
        assert refused.status_code == 503 and refused.headers["Retry-After"]
        assert refused.json()["retryable"] is True
        assert "postgresql is unreachable" in refused.json()["error"]["message"]
        assert time.monotonic() - started < 10  # refused at once, not a hang
    finally:
        s.pg.start()
    assert probe(s).returncode == 0
    a_job_using_every_store(s)  # the same processes: their connections came back
    assert api_get(s).status_code == 404  # answered again (that session does not exist)


def test_after_a_redis_restart_every_connection_comes_back(s: Services) -> None:
    s.redis.kill()
    try:
        down = probe(s)
        assert down.returncode == 1 and "redis unreachable at 127.0.0.1" in down.stderr
        started = time.monotonic()
        refused = httpx.get(f"{s.api}/healthz", timeout=30)
        assert refused.status_code == 503 and "redis is unreachable" in refused.text
        assert time.monotonic() - started < 10
    finally:
        s.redis.start()
    assert probe(s).returncode == 0
    a_job_using_every_store(s)
    answer = httpx.get(f"{s.api}/healthz", timeout=30)
    assert answer.status_code == 200, answer.text


@pytest.fixture
def s(services: Services) -> Services:
    return services
