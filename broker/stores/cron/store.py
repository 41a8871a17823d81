"""Scheduled jobs and their runs in PostgreSQL, and one tick of the scheduler.

Exactly once: a tick claims due jobs with `FOR UPDATE SKIP LOCKED` (any number of
processes may tick; each due job is taken by one), records each scheduled time as a run
keyed by (job, time) — a second insert of the same time does nothing — and creates the
run's agent job, with an id made from both, in the same transaction. The agent-run
messages are sent after the commit; a run whose job is still queued later is sent again
(an agent run is started once whatever the number of messages)."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import psycopg
from psycopg.types.json import Jsonb
from pydantic import BaseModel, Field, field_validator

from broker.config.policy import PermissionMode
from broker.errors import Invalid
from broker.pg.store import INSERT_JOB, INSERT_SESSION, _job_params
from broker.protocol import FINAL_STATUSES, JobSpec
from broker.stores.cron.schedule import Schedule, missed, next_after

BACKOFF_S = (30, 60, 300, 900, 3600)
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
RESEND_AFTER_S = 30


class CronError(Invalid):
    """A request about scheduled jobs that cannot be done; the message says why."""


class CronRules(BaseModel):
    """The scheduling job's rules, carried by every run (never more than it had)."""

    allow: list[str] = Field(default_factory=list)
    ask: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)
    permission_mode: PermissionMode = "default"
    admin: bool = False


class CronJob(BaseModel):
    id: str = ""
    agent_id: str
    user_id: str = ""
    name: str
    schedule: Schedule
    prompt: str = Field(min_length=1)
    model: str = "scripted"
    script: dict[str, Any] | None = None
    workspace: str
    session_id: str = ""  # '': a new isolated session per run
    origin_session: str = ""  # where an isolated run's result is announced (delivery session)
    delivery: Literal["session", "webhook", "none"] = "session"
    webhook_url: str = ""
    missed: Literal["skip", "run_once"] = "run_once"
    grace_s: int = Field(300, ge=0)
    anchor: datetime | None = None
    next_at: datetime | None = None
    enabled: bool = True
    rules: CronRules = Field(default_factory=CronRules)

    @field_validator("name")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not NAME.match(value):
            raise ValueError("a name is a slug: lower-case letters, digits and '-', 1-63")
        return value


class CronRun(BaseModel):
    cron_id: str
    scheduled_at: datetime
    status: str
    attempt: int
    job_id: str
    retry_at: datetime | None = None
    error: str = ""
    finished_at: datetime | None = None


COLUMNS = (
    "id, agent_id, user_id, name, schedule, prompt, model, script, workspace, session_id,"
    " origin_session, delivery, webhook_url, missed, grace_s, anchor, next_at, enabled, rules"
)

PLACEHOLDERS = ", ".join(["%s"] * len(COLUMNS.split(",")))


def run_job_id(cron_id: str, scheduled: datetime, attempt: int) -> str:
    stamp = scheduled.astimezone(UTC).strftime("%Y%m%dT%H%M%S")
    return f"cron-{cron_id[:12]}-{stamp}-{attempt}"


class CronStore:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    # -- jobs ------------------------------------------------------------------------------

    def add(self, job: CronJob, now: datetime, max_per_agent: int) -> CronJob:
        count = self.conn.execute(
            "SELECT count(*) AS n FROM cron_jobs WHERE agent_id = %s", (job.agent_id,)
        ).fetchone()
        if count and count["n"] >= max_per_agent:
            raise CronError(f"agent {job.agent_id} has {max_per_agent} scheduled jobs, the limit")
        job = job.model_copy(update={"id": uuid.uuid4().hex, "anchor": job.anchor or now})
        job.next_at = next_after(job.schedule, now - timedelta(microseconds=1), job.anchor)
        try:
            self.conn.execute(
                f"INSERT INTO cron_jobs ({COLUMNS}) VALUES ({PLACEHOLDERS})",
                _params(job),
            )
        except psycopg.errors.UniqueViolation:
            raise CronError(f"a scheduled job named {job.name} exists; update it") from None
        return job

    def get(self, agent_id: str, user_id: str, name: str) -> CronJob | None:
        row = self.conn.execute(
            f"SELECT {COLUMNS} FROM cron_jobs WHERE agent_id = %s AND user_id = %s AND name = %s",
            (agent_id, user_id, name),
        ).fetchone()
        return CronJob.model_validate(row) if row else None

    def jobs(self, agent_id: str, user_id: str) -> list[CronJob]:
        rows = self.conn.execute(
            f"SELECT {COLUMNS} FROM cron_jobs WHERE agent_id = %s AND user_id = %s ORDER BY name",
            (agent_id, user_id),
        ).fetchall()
        return [CronJob.model_validate(r) for r in rows]

    def update(self, job: CronJob, now: datetime) -> CronJob:
        job.next_at = next_after(job.schedule, now, job.anchor) if job.enabled else None
        self.conn.execute(
            f"UPDATE cron_jobs SET ({COLUMNS}) = ({PLACEHOLDERS}) WHERE id = %s",
            (*_params(job), job.id),
        )
        return job

    def remove(self, cron_id: str) -> None:
        self.conn.execute("DELETE FROM cron_jobs WHERE id = %s", (cron_id,))

    def runs(self, cron_id: str, limit: int = 20) -> list[CronRun]:
        rows = self.conn.execute(
            "SELECT cron_id, scheduled_at, status, attempt, job_id, retry_at, error, finished_at"
            " FROM cron_runs WHERE cron_id = %s ORDER BY scheduled_at DESC LIMIT %s",
            (cron_id, limit),
        ).fetchall()
        return [CronRun.model_validate(r) for r in rows]

    def run_now(self, job: CronJob, now: datetime) -> str:
        """A run outside the schedule, keyed by now like any other; returns its agent job
        (the caller sends it)."""
        with self.conn.transaction():
            if not self._record(job.id, now, "queued", run_job_id(job.id, now, 1)):
                raise CronError(f"{job.name} was started at this instant already")
            self._create_job(job, now, 1)
        return run_job_id(job.id, now, 1)

    # -- the tick --------------------------------------------------------------------------

    def tick(self, now: datetime) -> list[str]:
        """Start what is due at `now`; returns the agent jobs to send (after commit)."""
        send: list[str] = []
        with self.conn.transaction():
            due = self.conn.execute(
                f"SELECT {COLUMNS} FROM cron_jobs WHERE enabled AND next_at <= %s"
                " ORDER BY next_at LIMIT 50 FOR UPDATE SKIP LOCKED",
                (now,),
            ).fetchall()
            for row in due:
                job = CronJob.model_validate(row)
                assert job.next_at is not None
                times = missed(job.schedule, job.next_at, now, job.anchor)
                late = [t for t in times if now - t > timedelta(seconds=job.grace_s)]
                fire = [t for t in times if t not in late]
                if late and not fire and job.missed == "run_once":
                    fire, late = [late[-1]], late[:-1]  # one catch-up for the downtime
                for t in late:
                    self._record(job.id, t, "skipped", "", "missed (downtime); policy skip")
                for t in fire:
                    if self._record(job.id, t, "queued", run_job_id(job.id, t, 1)):
                        self._create_job(job, t, 1)
                        send.append(run_job_id(job.id, t, 1))
                self.conn.execute(
                    "UPDATE cron_jobs SET next_at = %s WHERE id = %s",
                    (next_after(job.schedule, now, job.anchor), job.id),
                )
            send += self._retries(now)
        return send

    def _record(
        self, cron_id: str, at: datetime, status: str, job_id: str, error: str = ""
    ) -> bool:
        row = self.conn.execute(
            "INSERT INTO cron_runs (cron_id, scheduled_at, status, job_id, error)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING cron_id",
            (cron_id, at, status, job_id, error),
        ).fetchone()
        return row is not None

    def _create_job(self, job: CronJob, at: datetime, attempt: int) -> None:
        job_id = run_job_id(job.id, at, attempt)
        session = job.session_id or job_id
        spec = JobSpec(
            prompt=job.prompt,
            workspace=job.workspace,
            agent_id=job.agent_id,
            user_id=job.user_id,
            model=job.model,
            script=job.script,
            label=f"cron:{job.name}",
            allow=job.rules.allow,
            ask=job.rules.ask,
            deny=job.rules.deny,
            permission_mode=job.rules.permission_mode,
            admin=job.rules.admin or not job.user_id,  # no user: a person made it
        )
        self.conn.execute(INSERT_SESSION, (session, job.agent_id, job.user_id))
        self.conn.execute(INSERT_JOB, _job_params(job_id, session, spec))

    def _retries(self, now: datetime) -> list[str]:
        rows = self.conn.execute(
            "SELECT r.cron_id, r.scheduled_at, r.attempt FROM cron_runs r"
            " WHERE r.status = 'retry' AND r.retry_at <= %s FOR UPDATE SKIP LOCKED",
            (now,),
        ).fetchall()
        send = []
        for r in rows:
            job_row = self.conn.execute(
                f"SELECT {COLUMNS} FROM cron_jobs WHERE id = %s", (r["cron_id"],)
            ).fetchone()
            if job_row is None:
                continue
            job = CronJob.model_validate(job_row)
            attempt = r["attempt"] + 1
            self._create_job(job, r["scheduled_at"], attempt)
            self.conn.execute(
                "UPDATE cron_runs SET status = 'queued', attempt = %s, job_id = %s"
                " WHERE cron_id = %s AND scheduled_at = %s",
                (
                    attempt,
                    run_job_id(job.id, r["scheduled_at"], attempt),
                    job.id,
                    r["scheduled_at"],
                ),
            )
            send.append(run_job_id(job.id, r["scheduled_at"], attempt))
        return send

    def settle(self, now: datetime) -> tuple[list[str], list[tuple[CronRun, dict[str, Any]]]]:
        """Runs whose agent job ended: ok, or failed with a retry after a backoff; a
        one-shot job that succeeded is removed. Returns the queued jobs to send again
        (their message may have been lost) and the finished runs with their jobs and
        where their results go (read here: a removed job is gone by delivery time)."""
        finished: list[tuple[CronRun, dict[str, Any]]] = []
        with self.conn.transaction():
            rows = self.conn.execute(
                "SELECT r.cron_id, r.scheduled_at, r.status, r.attempt, r.job_id, r.retry_at,"
                " r.error, r.finished_at, j.status AS job_status, j.error AS job_error,"
                " j.final_text, j.created_at AS job_created, c.schedule, c.name, c.delivery,"
                " c.webhook_url, c.session_id, c.origin_session"
                " FROM cron_runs r JOIN jobs j ON j.id = r.job_id JOIN cron_jobs c ON c.id ="
                " r.cron_id WHERE r.status = 'queued' FOR UPDATE OF r SKIP LOCKED"
            ).fetchall()
            resend = []
            for row in rows:
                run = CronRun.model_validate(row)
                if row["job_status"] not in FINAL_STATUSES:
                    if row["job_status"] == "queued" and now - row["job_created"] > timedelta(
                        seconds=RESEND_AFTER_S
                    ):
                        resend.append(run.job_id)
                    continue
                ok = row["job_status"] == "completed"
                if ok:
                    status, retry_at, error = "ok", None, ""
                elif run.attempt <= len(BACKOFF_S):
                    status = "retry"
                    retry_at = now + timedelta(seconds=BACKOFF_S[run.attempt - 1])
                    error = row["job_error"] or row["job_status"]
                else:
                    status, retry_at, error = "failed", None, row["job_error"] or row["job_status"]
                self.conn.execute(
                    "UPDATE cron_runs SET status = %s, retry_at = %s, error = %s, finished_at ="
                    " now() WHERE cron_id = %s AND scheduled_at = %s",
                    (status, retry_at, error[:2000], run.cron_id, run.scheduled_at),
                )
                if ok and row["schedule"].get("kind") == "at":
                    self.conn.execute("DELETE FROM cron_jobs WHERE id = %s", (run.cron_id,))
                finished.append((run, row))
        return resend, finished


def _params(job: CronJob) -> tuple[Any, ...]:
    """The job's values in the order of COLUMNS (JSON columns wrapped)."""
    values = job.model_dump(mode="python")
    values["schedule"] = Jsonb(job.schedule.model_dump(mode="json"))
    values["script"] = Jsonb(job.script) if job.script is not None else None
    values["rules"] = Jsonb(job.rules.model_dump(mode="json"))
    return tuple(values[c.strip()] for c in COLUMNS.split(","))
