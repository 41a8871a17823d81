"""Live configuration through the gateway tool, on two orchestrators: an invalid
configuration is refused naming the field, `deny: ["exec"]` holds for the very next jobs
on both orchestrators with no restart, a version no orchestrator can load is marked bad
and the last good one stays in force, and a rollback restores the behaviour."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from broker.config.live import LiveConfigStore
from broker.pg.store import Store
from broker.redis.presence import live_processes
from tests.integration.conftest import Cluster, start_cluster, wait_until
from tests.sites import Reply, Site


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    with Site({"/": Reply(body=b"hello from the site")}) as s:
        yield s


@pytest.fixture(scope="module")
def cluster(site: Site) -> Iterator[Cluster]:
    yield from start_cluster(
        groups=("fs", "runtime", "automation", "web"),
        orchestrators=2,
        web_private_allow=[site.endpoint],
    )


def gateway(cluster: Cluster, workspace: Path, **args: Any) -> Any:
    """One gateway call in an operator's job; administration is approved by an admin (the
    direct client's answer is an operator's)."""
    job = cluster.client.submit(
        "configure",
        workspace=str(workspace),
        allow=["gateway"],
        script={
            "turns": [
                {"tool_calls": [{"id": "g", "name": "gateway", "input": args}]},
                {"text": "done"},
            ]
        },
    )
    for event in job.events():
        if event.type == "approval_requested":
            job.approve(event.data["request_id"], "allow-once")
    (result,) = job.wait(timeout=60).tool_calls
    return result


def exec_jobs(cluster: Cluster, workspace: Path, n: int) -> list[tuple[Any, str]]:
    jobs = [
        cluster.client.submit(
            "run it",
            workspace=str(workspace),
            allow=["exec"],
            script={
                "turns": [
                    {"tool_calls": [{"id": "x", "name": "exec", "input": {"command": "echo hi"}}]},
                    {"text": "done"},
                ]
            },
        )
        for _ in range(n)
    ]
    out = []
    for job in jobs:
        (call,) = job.wait(timeout=60).tool_calls
        row = cluster.client.store.job(job.id)
        out.append(
            (
                call,
                str(
                    cluster.client.store.conn.execute(
                        "SELECT orchestrator FROM jobs WHERE id = %s", (job.id,)
                    ).fetchone()["orchestrator"]
                ),
            )
        )  # type: ignore[index]
        assert row is not None
    return out


def test_live_configuration_applies_everywhere_and_rolls_back(
    cluster: Cluster, workspace: Path
) -> None:
    refused = gateway(cluster, workspace, action="config.apply", config={"approval_timeout_s": -1})
    assert refused.is_error and "approval_timeout_s" in refused.output
    not_live = gateway(
        cluster, workspace, action="config.apply", config={"exec_confinement": "none"}
    )
    assert (
        not_live.is_error
        and "exec_confinement" in not_live.output
        and "not live" in not_live.output
    )

    people_only = gateway(
        cluster, workspace, action="config.apply", config={"message_channels": {}}
    )
    assert people_only.is_error and "only people" in people_only.output, people_only.output

    before = exec_jobs(cluster, workspace, 4)
    assert all(not c.is_error and "hi" in c.output for c, _ in before)

    dry = gateway(
        cluster,
        workspace,
        action="config.apply",
        config={"tool_policy": {"deny": ["exec"]}},
        dry_run=True,
    )
    assert not dry.is_error and "tool_policy" in dry.output
    assert all(
        not c.is_error for c, _ in exec_jobs(cluster, workspace, 2)
    )  # a dry run stores nothing

    applied = gateway(
        cluster, workspace, action="config.apply", config={"tool_policy": {"deny": ["exec"]}}
    )
    assert not applied.is_error and "applied version" in applied.output, applied.output
    # the very next jobs, until each orchestrator has run some: every one is refused
    after: list[tuple[Any, str]] = []
    while len({o for _, o in after}) < 2 and len(after) < 60:
        after += exec_jobs(cluster, workspace, 4)
    assert len({o for _, o in after}) == 2, "both orchestrators should have run some"
    assert all(c.is_error and "exec" in c.output for c, _ in after), [c.output for c, _ in after]

    # a version that cannot load (an unknown profile) is marked bad; exec stays denied
    bad = gateway(
        cluster, workspace, action="config.apply", config={"tool_policy": {"profile": "nope"}}
    )
    assert not bad.is_error
    assert all(c.is_error for c, _ in exec_jobs(cluster, workspace, 2))
    store = Store(cluster.iso.database_url)
    try:
        statuses = [v.status for v in LiveConfigStore(store.conn).history()]
        assert statuses[0] == "bad" and "applied" in statuses
    finally:
        store.close()

    back = gateway(cluster, workspace, action="config.rollback")
    assert not back.is_error and "in force" in back.output
    restored = exec_jobs(cluster, workspace, 4)
    assert all(not c.is_error and "hi" in c.output for c, _ in restored), [
        c.output for c, _ in restored
    ]


def fetch(cluster: Cluster, workspace: Path, url: str) -> Any:
    job = cluster.client.submit(
        "fetch",
        workspace=str(workspace),
        allow=["web_fetch"],
        script={
            "turns": [
                {"tool_calls": [{"id": "f", "name": "web_fetch", "input": {"url": url}}]},
                {"text": "done"},
            ]
        },
    )
    (result,) = job.wait(timeout=60).tool_calls
    return result


def web_pids(cluster: Cluster) -> list[int]:
    with redis.Redis.from_url(cluster.iso.redis_url) as client:
        return sorted(p["pid"] for p in live_processes(client) if p.get("queue") == "web")


def test_workers_take_a_new_domain_list_without_a_restart(
    cluster: Cluster, site: Site, workspace: Path
) -> None:
    """The web worker is told by a change notice, not at its next start: the first fetch
    that sees the new list comes while the worker keeps running (a fresh URL each time,
    so no cached page answers)."""
    pids = web_pids(cluster)
    assert pids
    urls = (f"{site.url}/?n={n}" for n in range(1000))
    assert "hello from the site" in fetch(cluster, workspace, next(urls)).output
    applied = gateway(
        cluster, workspace, action="config.apply", config={"web_allow_domains": ["only.example"]}
    )
    assert not applied.is_error, applied.output
    refused = wait_until(
        lambda: (r := fetch(cluster, workspace, next(urls))).is_error and r,
        30,
        "a fetch refused by the new domain list",
    )
    assert "allowed domain list" in refused.output, refused.output
    gateway(cluster, workspace, action="config.rollback")
    wait_until(
        lambda: "hello from the site" in fetch(cluster, workspace, next(urls)).output,
        30,
        "a fetch allowed again after the rollback",
    )
    assert web_pids(cluster) == pids


def test_workers_answer_remote_control(cluster: Cluster, workspace: Path) -> None:
    pinged = gateway(cluster, workspace, action="workers", op="ping")
    assert not pinged.is_error and "workers answered" in pinged.output, pinged.output
    assert int(pinged.output.split()[0]) >= 4  # fs, runtime, automation and web workers
    queues = gateway(cluster, workspace, action="workers", op="active_queues")
    assert not queues.is_error and "web" in queues.output and "automation" in queues.output


def test_workers_add_and_cancel_a_consumer_and_restart_a_pool(
    cluster: Cluster, workspace: Path
) -> None:
    pinged = gateway(cluster, workspace, action="workers", op="ping").output
    names = pinged.split(": ", 1)[1].split(", ")
    fs = next(n for n in names if n.startswith("fs."))
    runtime = next(n for n in names if n.startswith("runtime."))

    added = gateway(
        cluster, workspace, action="workers", op="add_consumer", queue="extra", destination=[fs]
    )
    assert f"{fs}: add consumer extra" in added.output, added.output
    queues = gateway(cluster, workspace, action="workers", op="active_queues", destination=[fs])
    assert "extra" in queues.output.split(": ", 1)[1].split(", "), queues.output

    cancelled = gateway(
        cluster, workspace, action="workers", op="cancel_consumer", queue="extra", destination=[fs]
    )
    assert f"{fs}: no longer consuming from extra" in cancelled.output, cancelled.output
    queues = gateway(cluster, workspace, action="workers", op="active_queues", destination=[fs])
    assert "extra" not in queues.output.split(": ", 1)[1].split(", "), queues.output

    restarted = gateway(
        cluster, workspace, action="workers", op="pool_restart", destination=[runtime]
    )
    assert f"{runtime}: reload started" in restarted.output, restarted.output
    # the prefork children are replaced; calls keep working after it
    wait_until(
        lambda: all(
            not c.is_error and "hi" in c.output for c, _ in exec_jobs(cluster, workspace, 1)
        ),
        30,
        "an exec call after the pool restart",
    )


def test_a_version_that_fails_the_orchestrators_health_check_is_rolled_back(
    cluster: Cluster, workspace: Path
) -> None:
    """Valid settings, but a hook program that is not on the orchestrators' host: such a
    hook would fail open on every exec; the version is marked bad and exec runs as before."""
    hooks = {"PreToolUse": [{"matcher": "exec", "hooks": [{"command": "/nonexistent/guard"}]}]}
    applied = gateway(cluster, workspace, action="config.apply", config={"hooks": hooks})
    assert not applied.is_error and "applied version" in applied.output, applied.output
    version = int(applied.output.split("applied version ")[1].split(";")[0])

    ran = exec_jobs(cluster, workspace, 2)
    assert all(not c.is_error and "hi" in c.output for c, _ in ran), [c.output for c, _ in ran]
    store = Store(cluster.iso.database_url)
    try:
        (row,) = [v for v in LiveConfigStore(store.conn).history() if v.version == version]
        assert row.status == "bad" and "/nonexistent/guard" in row.note, row
        current = LiveConfigStore(store.conn).current()
        assert current is None or "hooks" not in current.config
    finally:
        store.close()
