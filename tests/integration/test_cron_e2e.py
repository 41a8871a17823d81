"""Scheduled jobs through the stack: every orchestrator (the tickers) is SIGKILLed just
before a due time and started again after it; the scheduled time still produces exactly
one run, and the next one runs on schedule. And the cron tool as a job uses it."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker.cron_schedule import Schedule
from broker.cron_store import CronJob, CronStore
from broker.store import Store
from tests.integration.conftest import Cluster, script, start_cluster, wait_until


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(groups=("fs", "automation"), orchestrators=2, cron_tick_s=0.2)


def runs(store: Store, cron_id: str) -> list[dict[str, object]]:
    return store.conn.execute(
        "SELECT scheduled_at, status, job_id FROM cron_runs WHERE cron_id = %s"
        " ORDER BY scheduled_at",
        (cron_id,),
    ).fetchall()


def test_a_due_time_across_a_kill_of_every_ticker_runs_exactly_once(
    cluster: Cluster, workspace: Path
) -> None:
    store = Store(cluster.iso.database_url)
    try:
        now = datetime.now(UTC)
        due = now + timedelta(seconds=4)
        job = CronStore(store.conn).add(
            CronJob(
                agent_id="main",
                name="ping",
                schedule=Schedule(kind="every", every_s=60),
                prompt="ping",
                script=script({"text": "pong"}),
                workspace=str(workspace),
                anchor=due,  # fires at `due`, then every minute
                grace_s=60,
            ),
            now,
            50,
        )
        time.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds() - 1.5))
        orchestrators = list(range(cluster.stack.orchestrators))
        for i in orchestrators:  # every ticker dies before the due time
            cluster.stack.procs[i].send_signal(signal.SIGKILL)
            cluster.stack.procs[i].wait(10)
        time.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds() + 2))
        assert runs(store, job.id) == []  # nobody ticked while they were down
        for i in orchestrators:
            cluster.stack.procs[i] = subprocess.Popen(
                cluster.stack.commands[i], env=cluster.stack.env
            )
        wait_until(lambda: [r["status"] for r in runs(store, job.id)] == ["ok"], 60, "the run done")
        time.sleep(2)  # every orchestrator ticks ~10 times more: still one run
        (run,) = runs(store, job.id)
        assert run["scheduled_at"] == due
        row = store.conn.execute(
            "SELECT count(*) AS n FROM jobs WHERE id LIKE 'cron-%%'"
        ).fetchone()
        assert row is not None and row["n"] == 1
        final = store.conn.execute(
            "SELECT final_text FROM jobs WHERE id = %s", (run["job_id"],)
        ).fetchone()
        assert final is not None and final["final_text"] == "pong"
        nxt = CronStore(store.conn).get("main", "", "ping")
        assert nxt is not None and nxt.next_at == due + timedelta(seconds=60)
    finally:
        store.close()


def cron(call_id: str, **args: object) -> dict[str, object]:
    """A turn with one cron call (its input has a `name`, so not the shared helper)."""
    return {"tool_calls": [{"id": call_id, "name": "cron", "input": args}]}


def test_the_cron_tool_adds_lists_and_removes(cluster: Cluster, workspace: Path) -> None:
    job = cluster.client.submit(
        "schedule it",
        workspace=str(workspace),
        user="ann",
        allow=["cron"],
        script=script(
            cron(
                "a",
                action="add",
                name="standup",
                kind="cron",
                cron="0 9 * * 1-5",
                timezone="Europe/Berlin",
                prompt="summarise yesterday",
            ),
            cron("l", action="list"),
            cron("b", action="add", name="Bad Name", kind="every", every_s=60, prompt="x"),
            cron("r", action="remove", name="standup"),
            {"text": "done"},
        ),
    )
    result = job.wait(timeout=60)
    added, listed, bad, removed = result.tool_calls
    assert not added.is_error and "Monday through Friday" in added.output, added.output
    assert added.queue == "automation" and "next:" in added.output
    assert "standup" in listed.output and ("T07:00" in listed.output or "T08:00" in listed.output)
    assert bad.is_error and "name" in bad.output
    assert not removed.is_error and "removed standup" in removed.output
