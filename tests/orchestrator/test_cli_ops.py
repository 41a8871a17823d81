"""`clawq health …` and `clawq migrate` on the real Redis and PostgreSQL: readiness on
migrated, unmigrated and unreachable services; liveness on heartbeats written the way the
processes write them, and on a real orchestrator and worker that then stop."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
import redis
from click.testing import CliRunner, Result

from broker.pg.store import migrations
from broker.redis.presence import Heartbeat, process_id
from orchestrator.cli import main as cli
from orchestrator.cli.local.stack import Stack
from tests.conftest import PG_BASE, Isolated

CLAWQ = Path(sys.executable).parent / "clawq"  # the console script a probe runs


def health(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(cli.main, ["health", *args], env=env)


def one_line(result: Result) -> str:
    """The single line a failing probe says on stderr."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr: {result.stderr!r}"
    return lines[0]


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def node() -> str:
    return f"pod-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def unmigrated() -> Iterator[str]:
    """A database URL on a schema of its own that no migration has touched."""
    schema = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(PG_BASE, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    yield f"{PG_BASE}?options=-csearch_path%3D{schema}"
    with psycopg.connect(PG_BASE, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


# --- readiness ----------------------------------------------------------------------------


def test_ready_when_redis_and_a_migrated_postgres_answer(isolated: Isolated) -> None:
    latest = migrations()[-1][0]
    for args in (["orchestrator"], ["worker", "--group", "fs"]):
        done = health(isolated.env(), *args, "--probe", "ready")
        assert done.exit_code == 0, done.output
        redis_at, pg_at = urlsplit(isolated.redis_url).netloc, urlsplit(isolated.database_url)
        assert done.stdout.startswith(
            f"ok: redis {redis_at}; postgresql {pg_at.netloc.split('@')[-1]}"
        )
        assert f"(schema at {latest})" in done.stdout
        assert done.stderr == ""


def test_ready_fails_until_clawq_migrate_has_run(isolated: Isolated, unmigrated: str) -> None:
    env = {**isolated.env(), "CLAWQ_DATABASE_URL": unmigrated}
    before = health(env, "worker", "--group", "runtime", "--probe", "ready")
    assert before.exit_code == 1
    line = one_line(before)
    assert line.startswith("unhealthy: database schema behind: migration(s) 1, 2,")
    assert "(run `clawq migrate`)" in line and before.stdout == ""

    runner = CliRunner()
    first = runner.invoke(cli.main, ["migrate"], env=env)
    assert first.exit_code == 0, first.output
    count = len(migrations())
    assert first.stdout.strip() == f"schema at migration {migrations()[-1][0]}: {count} applied now"
    again = runner.invoke(cli.main, ["migrate"], env=env)
    assert again.stdout.strip().endswith(": 0 applied now")  # idempotent

    after = health(env, "worker", "--group", "runtime", "--probe", "ready")
    assert after.exit_code == 0, after.output


def test_ready_fails_when_redis_is_unreachable_without_showing_its_password(
    isolated: Isolated,
) -> None:
    port = free_port()
    env = {**isolated.env(), "CLAWQ_REDIS_URL": f"redis://:hunter2@127.0.0.1:{port}/0"}
    done = health(env, "orchestrator", "--probe", "ready")
    assert done.exit_code == 1
    line = one_line(done)
    assert line.startswith(f"unhealthy: redis unreachable at 127.0.0.1:{port}: "), line
    assert "hunter2" not in done.output


def test_ready_fails_when_postgres_is_unreachable_without_showing_its_password(
    isolated: Isolated,
) -> None:
    port = free_port()
    env = {
        **isolated.env(),
        "CLAWQ_DATABASE_URL": f"postgresql://clawq:hunter2@127.0.0.1:{port}/clawq",
    }
    done = health(env, "worker", "--group", "fs", "--probe", "ready")
    assert done.exit_code == 1
    line = one_line(done)
    assert line.startswith(f"unhealthy: postgresql unreachable at 127.0.0.1:{port}: "), line
    assert "hunter2" not in done.output


def test_a_probe_says_one_line_whatever_fails(isolated: Isolated) -> None:
    env = {**isolated.env(), "CLAWQ_WORKER_CONCURRENCY": "zero"}  # settings that do not load
    done = health(env, "worker", "--group", "fs", "--probe", "ready")
    assert done.exit_code == 1
    assert one_line(done).startswith(  # the setting, its value, what it should be
        "unhealthy: SettingsInvalid: CLAWQ_WORKER_CONCURRENCY='zero': Input should be a valid"
        " integer"
    )


def test_migrate_says_when_postgres_is_unreachable() -> None:
    port = free_port()
    env = {"CLAWQ_DATABASE_URL": f"postgresql://clawq:hunter2@127.0.0.1:{port}/clawq"}
    done = CliRunner().invoke(cli.main, ["migrate"], env=env)
    assert done.exit_code == 1
    assert f"postgresql unreachable at 127.0.0.1:{port}" in done.output
    assert "hunter2" not in done.output


# --- liveness -----------------------------------------------------------------------------


def worker_heartbeat(client: redis.Redis, node: str, group: str, ttl_s: float) -> Heartbeat:
    """This process's presence as a worker of `group` on `node`, as workers/execute.py
    writes it."""
    return Heartbeat(
        client,
        process_id("worker", node),
        {"kind": "worker", "queue": group, "node": node},
        interval_s=0.2,
        ttl_s=ttl_s,
        node=node,
    )


def test_live_follows_this_nodes_heartbeat_of_the_kind_and_queue(
    isolated: Isolated, node: str
) -> None:
    env = {**isolated.env(), "CLAWQ_NODE_NAME": node}
    client = redis.Redis.from_url(isolated.redis_url)
    beat = worker_heartbeat(client, node, "fs", ttl_s=30.0)
    beat.beat()  # fresh for the whole test; no refreshing thread to race the deletion below
    try:
        done = health(env, "worker", "--group", "fs", "--probe", "live")
        assert done.exit_code == 0, done.output
        assert done.stdout.strip() == f"ok: heartbeat {process_id('worker', node)}"

        # another queue, another node, another kind: not this process
        other_queue = health(env, "worker", "--group", "web", "--probe", "live")
        assert other_queue.exit_code == 1
        assert one_line(other_queue) == (
            f"unhealthy: no fresh heartbeat of any worker process on queue web on node {node}"
            f" (within {isolated.settings.heartbeat_ttl_s:g} s): the process is dead, stuck"
            " or not started"
        )
        elsewhere = {**env, "CLAWQ_NODE_NAME": f"{node}-other"}
        assert health(elsewhere, "worker", "--group", "fs", "--probe", "live").exit_code == 1
        orchestrator = health(env, "orchestrator", "--probe", "live")
        assert orchestrator.exit_code == 1
        assert "of any orchestrator process on queue agents" in one_line(orchestrator)

        both = health(env, "worker", "--group", "fs")  # --probe all: ready and live
        assert both.exit_code == 0, both.output
        assert "postgresql" in both.stdout and "heartbeat worker@" in both.stdout
    finally:
        beat.stop()  # a clean exit deletes the key
    gone = health(env, "worker", "--group", "fs", "--probe", "live")
    assert gone.exit_code == 1 and "no fresh heartbeat" in one_line(gone)
    client.close()


def test_live_fails_once_a_heartbeat_is_no_longer_refreshed(isolated: Isolated, node: str) -> None:
    env = {**isolated.env(), "CLAWQ_NODE_NAME": node}
    client = redis.Redis.from_url(isolated.redis_url)
    beat = worker_heartbeat(client, node, "media", ttl_s=0.5)
    beat.beat()  # one beat, never refreshed: a stuck or killed process
    assert health(env, "worker", "--group", "media", "--probe", "live").exit_code == 0
    time.sleep(0.7)
    stale = health(env, "worker", "--group", "media", "--probe", "live")
    assert stale.exit_code == 1 and "no fresh heartbeat" in one_line(stale)
    client.close()


def test_live_is_not_judged_when_redis_is_unreachable(node: str) -> None:
    """A restart would not bring Redis back: liveness passes, saying so; readiness fails."""
    env = {"CLAWQ_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "CLAWQ_NODE_NAME": node}
    done = health(env, "orchestrator", "--probe", "live")
    assert done.exit_code == 0
    assert one_line(done).startswith("liveness not judged: redis unreachable at 127.0.0.1:")
    assert health(env, "orchestrator").exit_code == 1  # all: readiness is judged first


def test_health_of_a_real_orchestrator_and_worker(isolated: Isolated, node: str) -> None:
    """The probes as Kubernetes runs them (the console script, in the processes' PID
    namespace) against a real stack, then after it stops."""
    env = {**isolated.env(), "CLAWQ_NODE_NAME": node}
    stack = Stack(["fs"], 1, env=env, concurrency=1)

    def probe(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CLAWQ), "health", *args],
            env=stack.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    stack.start()
    try:
        stack.wait_ready(isolated.redis_url)
        orchestrator = probe("orchestrator")
        assert orchestrator.returncode == 0, orchestrator.stderr
        assert f"heartbeat orchestrator@{node}:" in orchestrator.stdout
        worker = probe("worker", "--group", "fs")
        assert worker.returncode == 0, worker.stderr
        assert f"heartbeat worker@{node}:" in worker.stdout
        assert probe("worker", "--group", "runtime", "--probe", "live").returncode == 1
    finally:
        stack.stop()
    deadline = time.monotonic() + isolated.settings.heartbeat_ttl_s + 2
    while (live := probe("worker", "--group", "fs", "--probe", "live")).returncode == 0:
        assert time.monotonic() < deadline, "the stopped worker's heartbeat stayed fresh"
        time.sleep(0.2)
    assert live.returncode == 1 and "no fresh heartbeat of any worker" in live.stderr
    stopped = probe("orchestrator", "--probe", "live")
    assert stopped.returncode == 1, stopped.stdout
