"""Scheduling: fire times in the job's timezone across DST (a frozen clock), and the tick on
real PostgreSQL — racing tickers start each scheduled time once, a downtime gives one
catch-up with run_once and none with skip, reading never moves a next run, a failed run
is retried after its backoff."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from psycopg.types.json import Jsonb
from pydantic import ValidationError

from broker.pg.store import Store
from broker.stores.cron import CronJob, CronRules, CronStore, run_job_id
from broker.stores.cron.schedule import Schedule, describe, next_after, upcoming
from tests.conftest import Isolated

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def test_nine_in_berlin_is_seven_or_eight_utc_across_the_dst_change() -> None:
    berlin = Schedule(kind="cron", cron="0 9 * * *", timezone="Europe/Berlin")
    fires = upcoming(berlin, datetime(2026, 3, 27, 12, 0, tzinfo=UTC), None, 4)
    assert [f.strftime("%m-%d %H:%M") for f in fires] == [
        "03-28 08:00",  # CET, UTC+1
        "03-29 07:00",  # CEST from 29 March, UTC+2
        "03-30 07:00",
        "03-31 07:00",
    ]
    autumn = upcoming(berlin, datetime(2026, 10, 24, 12, 0, tzinfo=UTC), None, 2)
    assert [f.strftime("%m-%d %H:%M") for f in autumn] == ["10-25 08:00", "10-26 08:00"]
    assert "09:00" in describe(berlin) and "Europe/Berlin" in describe(berlin)


def test_every_counts_from_its_anchor_and_at_fires_once() -> None:
    every = Schedule(kind="every", every_s=60)
    assert next_after(every, T0 + timedelta(seconds=59), T0) == T0 + timedelta(seconds=60)
    assert next_after(every, T0 + timedelta(seconds=60), T0) == T0 + timedelta(seconds=120)
    assert describe(every) == "every 1 minute"
    at = Schedule(kind="at", at=T0)
    assert next_after(at, T0 - timedelta(seconds=1)) == T0 and next_after(at, T0) is None


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"kind": "every", "every_s": 30}, "every_s"),
        ({"kind": "cron", "cron": "61 * * * *"}, "cron"),
        ({"kind": "cron", "cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "timezone"),
        ({"kind": "at"}, "at"),
    ],
)
def test_bad_schedules_are_refused_naming_what_is_wrong(
    fields: dict[str, object], named: str
) -> None:
    with pytest.raises(ValidationError) as err:
        Schedule.model_validate(fields)
    assert named in str(err.value)


def job(name: str = "ping", **schedule: object) -> CronJob:
    return CronJob(
        agent_id="main",
        user_id="ann",
        name=name,
        schedule=Schedule.model_validate(schedule or {"kind": "every", "every_s": 60}),
        prompt="ping",
        workspace="/tmp",
        grace_s=30,
    )


def runs_by_time(store: Store) -> dict[datetime, list[str]]:
    rows = store.conn.execute("SELECT scheduled_at, status FROM cron_runs").fetchall()
    out: dict[datetime, list[str]] = {}
    for r in rows:
        out.setdefault(r["scheduled_at"], []).append(r["status"])
    return out


def test_racing_tickers_start_each_scheduled_time_once(isolated: Isolated) -> None:
    setup = Store(isolated.database_url)
    CronStore(setup.conn).add(job(), T0, 50)
    clock = [T0 + timedelta(seconds=s) for s in range(0, 301, 15)]
    sent: list[str] = []
    lock = threading.Lock()
    step = threading.Barrier(4)  # one shared clock: every ticker ticks the same instant

    def ticker() -> None:
        own = Store(isolated.database_url)
        try:
            for now in clock:
                step.wait()
                started = CronStore(own.conn).tick(now)
                with lock:
                    sent.extend(started)
        finally:
            own.close()

    threads = [threading.Thread(target=ticker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        expected = {T0 + timedelta(seconds=60 * k) for k in range(6)}  # 12:00 … 12:05
        assert set(runs_by_time(setup)) == expected
        assert all(statuses == ["queued"] for statuses in runs_by_time(setup).values())
        assert sorted(sent) == sorted(set(sent)) and len(sent) == 6  # each job sent once
        jobs = setup.conn.execute("SELECT count(*) AS n FROM jobs").fetchone()
        assert jobs is not None and jobs["n"] == 6
    finally:
        setup.close()


@pytest.mark.parametrize(("policy", "catch_up"), [("run_once", 1), ("skip", 0)])
def test_a_downtime_gives_one_catch_up_or_none(
    isolated: Isolated, policy: str, catch_up: int
) -> None:
    store = Store(isolated.database_url)
    try:
        cron = CronStore(store.conn)
        added = cron.add(job().model_copy(update={"missed": policy}), T0, 50)
        assert cron.tick(T0) == [run_job_id(added.id, T0, 1)]
        back = T0 + timedelta(seconds=340)  # down over 12:01 … 12:05 (all past the grace)
        started = cron.tick(back)
        assert len(started) == catch_up
        statuses = runs_by_time(store)
        missed = [statuses[T0 + timedelta(seconds=60 * k)] for k in range(1, 6)]
        assert sum(s == ["queued"] for s in missed) == catch_up
        assert sum(s == ["skipped"] for s in missed) == 5 - catch_up
        if catch_up:
            assert statuses[T0 + timedelta(seconds=300)] == ["queued"]  # the latest one
        after = cron.get("main", "ann", "ping")
        assert after is not None and after.next_at == T0 + timedelta(seconds=360)
        assert cron.tick(back) == []  # the same instant again: nothing new
    finally:
        store.close()


def test_reading_never_moves_the_next_run(isolated: Isolated) -> None:
    store = Store(isolated.database_url)
    try:
        cron = CronStore(store.conn)
        cron.add(job(kind="cron", cron="*/5 * * * *", timezone="Europe/Berlin"), T0, 50)
        before = cron.get("main", "ann", "ping")
        for _ in range(3):
            cron.jobs("main", "ann")
            cron.get("main", "ann", "ping")
        assert cron.get("main", "ann", "ping") == before
    finally:
        store.close()


def test_a_failed_run_is_retried_after_its_backoff(isolated: Isolated) -> None:
    store = Store(isolated.database_url)
    try:
        cron = CronStore(store.conn)
        added = cron.add(job(), T0, 50)
        (first,) = cron.tick(T0)
        store.conn.execute(
            "UPDATE jobs SET status = 'failed', error = 'boom' WHERE id = %s", (first,)
        )
        resend, finished = cron.settle(T0 + timedelta(seconds=5))
        assert resend == [] and len(finished) == 1
        (run,) = cron.runs(added.id)
        assert run.status == "retry" and run.retry_at == T0 + timedelta(seconds=35)
        assert cron.tick(T0 + timedelta(seconds=20)) == []  # not yet
        assert cron.tick(T0 + timedelta(seconds=36)) == [run_job_id(added.id, T0, 2)]
        (run,) = [r for r in cron.runs(added.id) if r.scheduled_at == T0]
        assert (run.status, run.attempt) == ("queued", 2)
    finally:
        store.close()


def spec_of(store: Store, job_id: str) -> dict[str, object]:
    row = store.conn.execute("SELECT spec FROM jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return dict(row["spec"])


def test_a_run_carries_the_rules_of_the_job_that_scheduled_it(isolated: Isolated) -> None:
    """Its allow/ask/deny, mode and admin flag, and its agent, user and workspace: the
    run is bounded as the scheduling job was, on every attempt."""
    store = Store(isolated.database_url)
    try:
        cron = CronStore(store.conn)
        rules = CronRules(
            allow=["cron"], ask=["web_fetch"], deny=["write_file", "exec"], permission_mode="plan"
        )
        added = cron.add(job().model_copy(update={"rules": rules}), T0, 50)
        assert cron.get("main", "ann", "ping") == added  # stored and read back
        (first,) = cron.tick(T0)
        spec = spec_of(store, first)
        assert (spec["allow"], spec["ask"], spec["deny"]) == (
            ["cron"],
            ["web_fetch"],
            ["write_file", "exec"],
        )
        assert spec["permission_mode"] == "plan" and spec["admin"] is False
        assert (spec["agent_id"], spec["user_id"], spec["workspace"]) == ("main", "ann", "/tmp")
        store.conn.execute("UPDATE jobs SET status = 'failed' WHERE id = %s", (first,))
        cron.settle(T0 + timedelta(seconds=1))
        (retry,) = cron.tick(T0 + timedelta(seconds=31))  # the retry: the same rules
        assert spec_of(store, retry)["deny"] == ["write_file", "exec"]
    finally:
        store.close()


def test_an_entry_from_before_the_rules_column_runs_with_its_user_and_no_rules(
    isolated: Isolated,
) -> None:
    """A row written without rules (the migration's default '{}'): no extra rules, not an
    admin's, still its user's."""
    store = Store(isolated.database_url)
    try:
        store.conn.execute(
            "INSERT INTO cron_jobs (id, agent_id, user_id, name, schedule, prompt, workspace,"
            " anchor, next_at) VALUES ('old1', 'main', 'ann', 'old', %s, 'ping', '/tmp', %s, %s)",
            (Jsonb({"kind": "every", "every_s": 60}), T0, T0),
        )
        old = CronStore(store.conn).get("main", "ann", "old")
        assert old is not None and old.rules == CronRules()
        (first,) = CronStore(store.conn).tick(T0)
        spec = spec_of(store, first)
        assert (spec["allow"], spec["ask"], spec["deny"]) == ([], [], [])
        assert spec["permission_mode"] == "default" and spec["admin"] is False
        assert spec["user_id"] == "ann"
    finally:
        store.close()


def test_an_entry_without_a_user_is_an_operators(isolated: Isolated) -> None:
    """Only an operator (holding the database) or an admin's job makes a user-less entry
    (a user's job always acts for its user): its runs are an admin's, as the direct
    client's jobs are, or they could never start."""
    store = Store(isolated.database_url)
    try:
        cron = CronStore(store.conn)
        cron.add(job().model_copy(update={"user_id": ""}), T0, 50)
        (first,) = cron.tick(T0)
        assert spec_of(store, first)["admin"] is True
    finally:
        store.close()


def test_the_row_lock_alone_keeps_a_second_ticker_off_a_job_being_ticked(
    isolated: Isolated,
) -> None:
    """Guard one, alone: while a ticker holds a due job (its tick's transaction is open),
    another ticker skips it at once (no wait, no run); once released, it is due again."""
    holder, other = Store(isolated.database_url), Store(isolated.database_url)
    try:
        added = CronStore(holder.conn).add(job(), T0, 50)
        with holder.conn.transaction():
            holder.conn.execute("SELECT id FROM cron_jobs WHERE id = %s FOR UPDATE", (added.id,))
            done: list[list[str]] = []
            racer = threading.Thread(target=lambda: done.append(CronStore(other.conn).tick(T0)))
            racer.start()
            racer.join(timeout=10)
            assert not racer.is_alive(), "the second ticker waited for the lock"
            assert done == [[]]
            assert runs_by_time(other) == {}  # it recorded no run either
        assert CronStore(other.conn).tick(T0) == [run_job_id(added.id, T0, 1)]
    finally:
        holder.close()
        other.close()


def test_the_run_key_alone_keeps_a_scheduled_time_once(isolated: Isolated) -> None:
    """Guard two, alone: a ticker that saw the job due after another had started that
    time (here: its next run put back, nothing locked) starts nothing: (job, time) has
    its run already."""
    store = Store(isolated.database_url)
    try:
        cron = CronStore(store.conn)
        added = cron.add(job(), T0, 50)
        assert cron.tick(T0) == [run_job_id(added.id, T0, 1)]
        store.conn.execute("UPDATE cron_jobs SET next_at = %s WHERE id = %s", (T0, added.id))
        assert cron.tick(T0 + timedelta(seconds=1)) == []
        assert runs_by_time(store) == {T0: ["queued"]}
        jobs = store.conn.execute("SELECT count(*) AS n FROM jobs").fetchone()
        assert jobs is not None and jobs["n"] == 1
    finally:
        store.close()


def test_a_run_whose_job_is_still_queued_after_30_s_is_sent_again(isolated: Isolated) -> None:
    """Its agent-run message may have been lost: after RESEND_AFTER_S (30 s) of being
    queued, settle returns it to send again (starting it twice is harmless); not before,
    and not once it runs. The clock is the job's own creation time, moved by hand."""
    store = Store(isolated.database_url)
    try:
        cron = CronStore(store.conn)
        cron.add(job(), T0, 50)
        (first,) = cron.tick(T0)
        row = store.conn.execute("SELECT created_at FROM jobs WHERE id = %s", (first,))
        created = row.fetchone()["created_at"]
        assert cron.settle(created + timedelta(seconds=29)) == ([], [])
        assert cron.settle(created + timedelta(seconds=31)) == ([first], [])
        assert cron.settle(created + timedelta(seconds=600)) == ([first], [])  # each tick
        store.conn.execute("UPDATE jobs SET status = 'running' WHERE id = %s", (first,))
        assert cron.settle(created + timedelta(seconds=600)) == ([], [])
    finally:
        store.close()
