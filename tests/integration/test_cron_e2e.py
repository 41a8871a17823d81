"""Scheduled jobs through the stack: a due time passes while every orchestrator (the
tickers) is SIGKILLed, and they are started again after it; the scheduled time still
produces exactly one run, and the next one runs on schedule. And the cron tool as a job
uses it."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from broker.pg.store import Store
from broker.stores.cron import CronJob, CronStore
from broker.stores.cron.schedule import Schedule
from orchestrator.services.cron import Ticker
from tests.integration.conftest import Cluster, script, start_cluster, wait_until
from tests.sites import Reply, Site


@pytest.fixture(scope="module")
def receiver() -> Iterator[Site]:
    with Site({"/hook": Reply(status=204)}) as site:
        yield site


@pytest.fixture(scope="module")
def cluster(receiver: Site) -> Iterator[Cluster]:
    yield from start_cluster(
        groups=("fs", "automation"),
        orchestrators=2,
        cron_tick_s=0.2,
        web_private_allow=[receiver.endpoint],
    )


def runs(store: Store, cron_id: str) -> list[dict[str, object]]:
    return store.conn.execute(
        "SELECT scheduled_at, status, job_id FROM cron_runs WHERE cron_id = %s"
        " ORDER BY scheduled_at",
        (cron_id,),
    ).fetchall()


def test_a_due_time_across_a_kill_of_every_ticker_runs_exactly_once(
    cluster: Cluster, workspace: Path
) -> None:
    """An `every` job and a daily cron job (Berlin time) whose due time passes while every
    ticker is dead: when they are back, one run each, and ticking on (by the live tickers,
    and by hand at later times) adds none; the next is on time. No wall-clock wait: every
    ticker is killed first, the jobs are added as if before a due time that has just
    passed, and their next due times are an hour and a day away."""
    store = Store(cluster.iso.database_url)
    try:
        orchestrators = list(range(cluster.stack.orchestrators))
        for i in orchestrators:  # every ticker dies
            cluster.stack.procs[i].send_signal(signal.SIGKILL)
            cluster.stack.procs[i].wait(10)
        now = datetime.now(UTC).replace(microsecond=0)
        berlin = now.astimezone(ZoneInfo("Europe/Berlin"))
        schedules = {
            "ping": (Schedule(kind="every", every_s=3600), now - timedelta(seconds=1)),
            "tick": (
                Schedule(
                    kind="cron",
                    cron=f"{berlin.minute} {berlin.hour} * * *",
                    timezone="Europe/Berlin",
                ),
                now.replace(second=0),
            ),
        }
        crons = CronStore(store.conn)
        jobs = {
            name: crons.add(
                CronJob(
                    agent_id="main",
                    name=name,
                    schedule=schedule,
                    prompt="ping",
                    script=script({"text": "pong"}),
                    workspace=str(workspace),
                    anchor=due if schedule.kind == "every" else None,
                    grace_s=300,
                ),
                due - timedelta(seconds=30),  # added while the tickers were alive
                50,
            )
            for name, (schedule, due) in schedules.items()
        }
        for name, job in jobs.items():
            assert job.next_at == schedules[name][1] <= now
            assert runs(store, job.id) == []
        for i in orchestrators:
            cluster.stack.procs[i] = subprocess.Popen(
                cluster.stack.commands[i], env=cluster.stack.env
            )
        for job in jobs.values():
            wait_until(
                lambda j=job: [r["status"] for r in runs(store, j.id)] == ["ok"],  # type: ignore[misc]
                60,
                f"the run of {job.name} done",
            )
        ticker = Ticker(cluster.iso.settings, cluster.client.app)
        try:  # the same tick the orchestrators run, at later times short of the next due
            for seconds in (0, 1, 30, 600):
                assert ticker.tick(now + timedelta(seconds=seconds)) == 0
        finally:
            ticker.close()
        nexts = {"ping": timedelta(hours=1), "tick": timedelta(days=1)}
        for name, job in jobs.items():
            due = schedules[name][1]
            (run,) = runs(store, job.id)
            assert run["scheduled_at"] == due
            final = store.conn.execute(
                "SELECT final_text FROM jobs WHERE id = %s", (run["job_id"],)
            ).fetchone()
            assert final is not None and final["final_text"] == "pong"
            nxt = CronStore(store.conn).get("main", "", name)
            assert nxt is not None and nxt.next_at == due + nexts[name]
        row = store.conn.execute(
            "SELECT count(*) AS n FROM jobs WHERE id LIKE 'cron-%%'"
        ).fetchone()
        assert row is not None and row["n"] == 2
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


def test_an_isolated_runs_result_is_announced_to_the_session_that_scheduled_it(
    cluster: Cluster, workspace: Path
) -> None:
    at = (datetime.now(UTC) + timedelta(seconds=3)).isoformat()
    origin = cluster.client.submit(
        "remind me",
        workspace=str(workspace),
        user="bob",
        allow=["cron"],
        script={
            **script(
                cron(
                    "a",
                    action="add",
                    name="report",
                    kind="at",
                    at=at,
                    prompt="make the report",
                    script={"turns": [{"text": "report ready"}]},
                ),
                {"text": "scheduled"},
            ),
            "on_announce": {"turns": [{"text": "noted"}]},
        },
    )
    (added,) = origin.wait(timeout=60).tool_calls
    assert not added.is_error, added.output
    session = cluster.client.store.job(origin.id)["session_id"]  # type: ignore[index]
    store = Store(cluster.iso.database_url)
    try:

        def announced() -> list[dict[str, object]]:
            return store.conn.execute(
                "SELECT spec->>'prompt' AS prompt, final_text FROM jobs"
                " WHERE session_id = %s AND id <> %s AND status = 'completed'",
                (session, origin.id),
            ).fetchall()

        wait_until(lambda: len(announced()) == 1, 60, "the announcement delivered")
        (row,) = announced()
        assert str(row["prompt"]).startswith("[scheduled job report at ")
        assert "completed]\nreport ready" in str(row["prompt"]) and row["final_text"] == "noted"
        gone = store.conn.execute("SELECT 1 FROM cron_jobs WHERE name = 'report'").fetchone()
        assert gone is None  # a one-shot `at` job is removed after it succeeds
    finally:
        store.close()


def test_a_webhook_delivery_posts_the_runs_result_once(
    cluster: Cluster, workspace: Path, receiver: Site
) -> None:
    store = Store(cluster.iso.database_url)
    try:
        now = datetime.now(UTC)
        CronStore(store.conn).add(
            CronJob(
                agent_id="main",
                name="hooked",
                schedule=Schedule(kind="at", at=now + timedelta(seconds=2)),
                prompt="say it",
                script=script({"text": "delivered text"}),
                workspace=str(workspace),
                delivery="webhook",
                webhook_url=receiver.url + "/hook",
            ),
            now,
            50,
        )
        wait_until(lambda: "/hook" in receiver.paths(), 60, "the webhook posted")
        time.sleep(1.0)  # more ticks: still one post
        (seen,) = [s for s in receiver.seen if s.path == "/hook"]
        body = seen.json()
        assert seen.method == "POST" and body["name"] == "hooked"
        assert body["status"] == "completed" and body["text"] == "delivered text"
    finally:
        store.close()


def test_a_scheduled_run_carries_the_rules_of_the_job_that_scheduled_it(
    cluster: Cluster, workspace: Path
) -> None:
    """Issue 26 (6): a run scheduled by a job that may not write could write."""
    at = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
    write = {"id": "w", "name": "write_file", "input": {"path": "ran.txt", "content": "x"}}
    origin = cluster.client.submit(
        "schedule a write",
        workspace=str(workspace),
        user="carol",
        admin=False,  # a user's job, as over the API
        allow=["cron"],
        deny=["write_file", "exec"],
        script=script(
            cron(
                "a",
                action="add",
                name="writer",
                kind="at",
                at=at,
                prompt="write it",
                script={"turns": [{"tool_calls": [write]}, {"text": "tried"}]},
            ),
            {"text": "scheduled"},
        ),
    )
    (added,) = origin.wait(timeout=60).tool_calls
    assert not added.is_error, added.output
    store = Store(cluster.iso.database_url)
    try:

        def run() -> dict[str, object] | None:
            return store.conn.execute(
                "SELECT id, spec FROM jobs WHERE spec->>'label' = 'cron:writer'"
                " AND status IN ('completed', 'failed')"
            ).fetchone()

        row = wait_until(run, 60, "the scheduled run finished")
    finally:
        store.close()
    result = cluster.client.job(str(row["id"])).result()
    (tried,) = result.tool_calls
    assert tried.is_error and tried.decision == "deny:rule", tried
    assert not (workspace / "ran.txt").exists()
    assert row["spec"]["deny"] == ["write_file", "exec"] and row["spec"]["admin"] is False


def test_an_update_by_a_job_binds_the_entry_to_that_jobs_rules(
    cluster: Cluster, workspace: Path
) -> None:
    """A job that may not write reschedules and rewrites an entry that a job which may
    write made: the run is the updating job's, and its write is refused."""
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    made = cluster.client.submit(
        "schedule a note",
        workspace=str(workspace),
        user="dave",
        admin=False,
        allow=["cron"],
        script=script(
            cron("a", action="add", name="reshaped", kind="at", at=later, prompt="note it"),
            {"text": "scheduled"},
        ),
    )
    (added,) = made.wait(timeout=60).tool_calls
    assert not added.is_error, added.output
    soon = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
    write = {"id": "w", "name": "write_file", "input": {"path": "reshaped.txt", "content": "x"}}
    updater = cluster.client.submit(
        "make it write",
        workspace=str(workspace),
        user="dave",
        admin=False,
        allow=["cron"],
        deny=["write_file", "exec"],
        script=script(
            cron(
                "u",
                action="update",
                name="reshaped",
                at=soon,
                script={"turns": [{"tool_calls": [write]}, {"text": "tried"}]},
            ),
            {"text": "updated"},
        ),
    )
    (updated,) = updater.wait(timeout=60).tool_calls
    assert not updated.is_error, updated.output
    store = Store(cluster.iso.database_url)
    try:

        def run() -> dict[str, object] | None:
            return store.conn.execute(
                "SELECT id, spec FROM jobs WHERE spec->>'label' = 'cron:reshaped'"
                " AND status IN ('completed', 'failed')"
            ).fetchone()

        row = wait_until(run, 60, "the rescheduled run finished")
    finally:
        store.close()
    (tried,) = cluster.client.job(str(row["id"])).result().tool_calls
    assert tried.is_error and tried.decision == "deny:rule", tried
    assert not (workspace / "reshaped.txt").exists()
    assert row["spec"]["deny"] == ["write_file", "exec"]
