"""`clawq health …`, `clawq migrate` and `clawq status`: what a supervisor (Kubernetes)
runs beside the processes, and what an operator reads.

`clawq health orchestrator|worker --group G [--probe ready|live|all]` exits 0 when healthy
and 1 when not, with one line on stderr saying why:

- ready: Redis answers, PostgreSQL answers and its schema has every migration this
  version knows (else `clawq migrate` has not run yet);
- live: this node's process of that kind (and queue) has a fresh heartbeat. Heartbeats are
  the keys `clawq:proc:<kind>@<node>:<pid>` every executing process and orchestrator
  refreshes each `CLAWQ_HEARTBEAT_INTERVAL_S` and that expire after `CLAWQ_HEARTBEAT_TTL_S`
  (broker/redis/presence.py), so a present key is a fresh one. The node is `Settings.node()`,
  as the processes name themselves; the pids are this PID namespace's (the probe runs in
  the process's container), so the check reads a handful of keys, never the keyspace.
  When Redis cannot be reached, liveness is not judged (exit 0, said on stderr): a
  restart would not bring Redis back, and readiness reports it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import click

from broker.config.settings import Settings
from broker.errors import Signal
from broker.protocol import AGENTS_QUEUE
from broker.redis.presence import queues_of
from orchestrator.cli.common import (
    first_line,
    group_option,
    json_option,
    reachable,
    settings_from_env,
    table,
    where,
)

PROBES = ("ready", "live", "all")
CONNECT_TIMEOUT_S = 3  # a probe's whole run stays well inside its timeoutSeconds
MGET_CHUNK = 1000


class Unhealthy(Signal):
    """One line saying why a probe fails."""


def applied_migrations(conn: Any) -> set[int]:
    """The migration versions recorded in the database (none: the schema is new)."""
    from psycopg.rows import tuple_row

    cur = conn.cursor(row_factory=tuple_row)
    row = cur.execute("SELECT to_regclass('clawq_migrations') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return set()
    return {version for (version,) in cur.execute("SELECT version FROM clawq_migrations")}


def check_redis(settings: Settings) -> None:
    import redis

    client = redis.Redis.from_url(
        settings.redis_url,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=CONNECT_TIMEOUT_S,
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        raise Unhealthy(
            f"redis unreachable at {where(settings.redis_url)}: {first_line(exc)}"
        ) from None
    finally:
        client.close()


def check_postgres(settings: Settings) -> int:
    """PostgreSQL answers and has every migration this version knows; the latest one."""
    import psycopg

    from broker.pg.store import migrations

    try:
        with psycopg.connect(settings.database_url, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            done = applied_migrations(conn)
    except psycopg.Error as exc:
        what = "unreachable at" if isinstance(exc, psycopg.OperationalError) else "error at"
        raise Unhealthy(
            f"postgresql {what} {where(settings.database_url)}: {first_line(exc)}"
        ) from None
    missing = [version for version, _ in migrations() if version not in done]
    if missing:
        raise Unhealthy(
            f"database schema behind: migration(s) {', '.join(map(str, missing))} not applied"
            " (run `clawq migrate`)"
        )
    return max(done, default=0)


def local_pids() -> list[int] | None:
    """Every pid of this PID namespace; None where there is no /proc to list."""
    try:
        return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return None


def heartbeats(client: Any, kind: str, node: str) -> list[dict[str, Any]]:
    """The fresh heartbeats of this node's processes of `kind`."""
    from broker import keys

    pids = local_pids()
    if pids is None:  # no /proc: every process of the node, by a scan
        pattern = keys.proc(f"{kind}@{_glob_escape(node)}:*")
        names = [k.decode() for k in client.scan_iter(match=pattern, count=1000)]
    else:
        names = [keys.proc(f"{kind}@{node}:{pid}") for pid in pids]  # as process_id names them
    found = []
    for start in range(0, len(names), MGET_CHUNK):
        for raw in client.mget(names[start : start + MGET_CHUNK]):
            if raw:
                info = json.loads(raw)
                if info.get("kind") == kind and info.get("host") == node:
                    found.append(info)
    return found


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def check_heartbeat(settings: Settings, kind: str, queue: str) -> str:
    """The id of a fresh heartbeat of this node's `kind` process on `queue`; a note when
    Redis is unreachable (not judged); Unhealthy when there is none."""
    import redis

    node = settings.node()
    client = redis.Redis.from_url(
        settings.redis_url,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=CONNECT_TIMEOUT_S,
    )
    try:
        live = [p for p in heartbeats(client, kind, node) if queue in queues_of(p)]
    except redis.RedisError as exc:
        click.echo(
            f"liveness not judged: redis unreachable at {where(settings.redis_url)}"
            f" ({first_line(exc)})",
            err=True,
        )
        return ""
    finally:
        client.close()
    if not live:
        raise Unhealthy(
            f"no fresh heartbeat of any {kind} process on queue {queue} on node {node} (within"
            f" {settings.heartbeat_ttl_s:g} s): the process is dead, stuck or not started"
        )
    return ", ".join(sorted(str(p.get("id", "")) for p in live))


def run_probe(settings: Settings, probe: str, kind: str, queue: str) -> str:
    """What is healthy, in a few words; Unhealthy (one line) when something is not."""
    said = []
    if probe in ("ready", "all"):
        check_redis(settings)
        said.append(f"redis {where(settings.redis_url)}")
        version = check_postgres(settings)
        said.append(f"postgresql {where(settings.database_url)} (schema at {version})")
    if probe in ("live", "all"):
        proc = check_heartbeat(settings, kind, queue)
        if proc:
            said.append(f"heartbeat {proc}")
    return "; ".join(said)


def _probe(probe: str, kind: str, queue: str) -> None:
    from orchestrator.cli.common import settings_from_env

    try:
        healthy = run_probe(settings_from_env(), probe, kind, queue)
    except Unhealthy as exc:
        click.echo(f"unhealthy: {exc}", err=True)
        sys.exit(1)
    except Exception as exc:  # settings that do not validate, …: still one line
        click.echo(f"unhealthy: {type(exc).__name__}: {first_line(exc)}", err=True)
        sys.exit(1)
    click.echo(f"ok: {healthy}" if healthy else "ok")


probe_option = click.option(
    "--probe",
    type=click.Choice(PROBES),
    default="all",
    show_default=True,
    help="ready: Redis and PostgreSQL reachable, the schema migrated; live: a fresh "
    "heartbeat of this node's process; all: both.",
)


@click.group()
def health() -> None:
    """Health probes (Kubernetes exec probes): exit 0 healthy, 1 not, one line on stderr."""


@health.command("orchestrator")
@probe_option
def health_orchestrator(probe: str) -> None:
    """This node's orchestrator: its services, and its heartbeat."""
    _probe(probe, "orchestrator", AGENTS_QUEUE)


@health.command("worker")
@group_option("Tool group whose worker is checked (its queue).")
@probe_option
def health_worker(group: str, probe: str) -> None:
    """This node's worker of GROUP: its services, and the heartbeat of a process of it."""
    _probe(probe, "worker", group)


@click.command()
def migrate() -> None:
    """Apply the database migrations not yet applied (every process also does so when it
    connects; this runs them first, e.g. as a deployment's migration job)."""
    import psycopg

    from broker.pg.store import Store
    from orchestrator.cli.common import settings_from_env

    settings = settings_from_env()
    try:
        store = Store(settings.database_url)
    except psycopg.Error as exc:
        raise click.ClickException(
            f"postgresql unreachable at {where(settings.database_url)}: {exc}"
        ) from None
    try:
        before = applied_migrations(store.conn)
        store.migrate()
        after = applied_migrations(store.conn)
    finally:
        store.close()
    click.echo(f"schema at migration {max(after, default=0)}: {len(after - before)} applied now")


@click.command()
@json_option
def status(as_json: bool) -> None:
    """List the live orchestrators and workers, per queue; warn when the broker's Redis
    would lose work (no append-only file, or keys it may evict)."""
    import redis

    from broker import keys
    from broker.redis.presence import live_processes

    settings = settings_from_env()
    client = redis.Redis.from_url(settings.redis_url)
    with reachable(settings):
        live = live_processes(client)
        found: dict[bytes, bytes] = client.hgetall(keys.CALLS_WAITING)  # type: ignore[assignment]
    report: dict[str, Any] = {
        "orchestrators": sorted(
            (p for p in live if p.get("kind") == "orchestrator"), key=lambda p: p["id"]
        ),
        "queues": {},
    }
    for proc in sorted((p for p in live if p.get("kind") == "worker"), key=lambda p: p["id"]):
        for queue in queues_of(proc):  # a worker of several light groups is under each
            report["queues"].setdefault(queue, []).append(proc)
    waiting = [json.loads(v) | {"call": k.decode()} for k, v in found.items()]
    report["waiting"] = waiting
    rows = [("orchestrator", "agents", p["id"], "", "") for p in report["orchestrators"]]
    rows += [
        ("worker", queue, p["id"], p.get("node", ""), p.get("confinement", ""))
        for queue, procs in report["queues"].items()
        for p in procs
    ]
    rows += [
        ("waiting call", w["queue"], w["call"], f"{time.time() - w['since']:.0f} s", w["tool"])
        for w in sorted(waiting, key=lambda w: w["since"])
    ]
    from broker.redis.durability import redis_warnings

    report["redis"], warnings = redis_warnings(client)
    report["redis"]["warnings"] = warnings
    table(("kind", "queue", "process", "node", "confinement"), rows, report, as_json)
    if waiting:
        click.echo(f"{len(waiting)} calls wait for a worker: start one for their queue", err=True)
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
