"""`clawq cron …`: scheduled agent jobs for people, beside the cron tool agents use (the
same rows: broker/stores/cron/). An entry made here is an operator's: its runs carry the
rules given here (`--allow`, …), as a run of the tool carries its job's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import click
from pydantic import ValidationError

from broker.config.settings import Settings
from broker.errors import Invalid
from broker.stores.cron import CronJob, CronRules, CronStore
from broker.stores.cron.schedule import Schedule, describe, upcoming
from orchestrator.cli.common import database, json_option, refused_as_usage, table


@contextmanager
def opened() -> Iterator[tuple[Settings, CronStore]]:
    with database() as (settings, store), refused_as_usage():
        yield settings, CronStore(store.conn)


def owner(fn: click.decorators.FC) -> click.decorators.FC:
    fn = click.option("--user", default="", help="Whose entry (default: the agent's own).")(fn)
    return click.option("--agent", default="main", show_default=True)(fn)


@click.group()
def cron() -> None:
    """Scheduled agent jobs (the cron tool's entries): list, add, remove, runs."""


@cron.command("list")
@owner
@json_option
def list_(agent: str, user: str, as_json: bool) -> None:
    """The agent's (and user's) scheduled jobs, with their next run."""
    now = datetime.now(UTC)
    with opened() as (_, store):
        jobs = store.jobs(agent, user)
    rows = [
        (
            j.name,
            describe(j.schedule),
            next(iter(upcoming(j.schedule, now, j.anchor)), None),
            j.enabled,
            j.model,
            j.prompt.splitlines()[0][:60],
        )
        for j in jobs
    ]
    columns = ("name", "schedule", "next", "enabled", "model", "prompt")
    table(columns, rows, [j.model_dump(mode="json") for j in jobs], as_json)


@cron.command("add")
@click.argument("name")
@click.option("--at", "at", default=None, help="Once, at this ISO time (with an offset, or UTC).")
@click.option("--every", "every_s", type=int, default=None, help="Every N seconds (N ≥ 60).")
@click.option("--cron", "expression", default=None, help="A cron expression: '0 9 * * 1-5'.")
@click.option("--timezone", default="UTC", show_default=True, help="Of --cron: an IANA zone.")
@click.option("--prompt", required=True, help="What each run is asked.")
@click.option("--model", default="scripted", show_default=True)
@click.option("--script", "script_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--workspace", type=click.Path(file_okay=False), default=".", show_default=True)
@click.option("--allow", multiple=True, help="An allow rule its runs carry (repeatable).")
@click.option(
    "--missed", type=click.Choice(["skip", "run_once"]), default="run_once", show_default=True
)
@owner
def add(
    name: str,
    at: str | None,
    every_s: int | None,
    expression: str | None,
    timezone: str,
    prompt: str,
    model: str,
    script_file: str | None,
    workspace: str,
    allow: tuple[str, ...],
    missed: str,
    agent: str,
    user: str,
) -> None:
    """Schedule NAME: once (--at), every N seconds (--every) or by --cron."""
    kinds = {"at": at, "every": every_s, "cron": expression}
    given = [k for k, v in kinds.items() if v is not None]
    if len(given) != 1:
        raise click.UsageError("give one of --at, --every or --cron")
    try:
        schedule = Schedule(
            kind=given[0],
            at=datetime.fromisoformat(at) if at else None,
            every_s=every_s,
            cron=expression,
            timezone=timezone,
        )
        job = CronJob(
            agent_id=agent,
            user_id=user,
            name=name,
            schedule=schedule,
            prompt=prompt,
            model=model,
            script=json.loads(Path(script_file).read_text()) if script_file else None,
            workspace=str(Path(workspace).resolve()),
            missed=missed,
            rules=CronRules(allow=list(allow), admin=True),
        )
    except (ValidationError, ValueError) as exc:
        raise click.UsageError(_first(exc)) from None
    now = datetime.now(UTC)
    with opened() as (settings, store):
        made = store.add(job, now, settings.cron_max_jobs_per_agent)
    first = next(iter(upcoming(made.schedule, now, made.anchor)), None)
    click.echo(f"added {made.name}: {describe(made.schedule)}; next: {first or 'none'}")


def _first(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"]) or "schedule"
        return f"{where}: {error['msg']}"
    return str(exc)


def _entry(store: CronStore, agent: str, user: str, name: str) -> CronJob:
    found = store.get(agent, user, name)
    if found is None:
        raise Invalid(f"no scheduled job {name} of agent {agent}; clawq cron list shows them")
    return found


@cron.command("remove")
@click.argument("name")
@owner
def remove(name: str, agent: str, user: str) -> None:
    """Remove a scheduled job (its past runs' jobs stay)."""
    with opened() as (_, store):
        store.remove(_entry(store, agent, user, name).id)
    click.echo(f"removed {name}", err=True)


@cron.command("runs")
@click.argument("name")
@owner
@json_option
def runs(name: str, agent: str, user: str, as_json: bool) -> None:
    """A scheduled job's latest runs: when, status, attempt, its agent job."""
    with opened() as (_, store):
        found = store.runs(_entry(store, agent, user, name).id)
    rows = [(r.scheduled_at, r.status, r.attempt, r.job_id, r.error) for r in found]
    columns = ("scheduled", "status", "attempt", "job", "error")
    table(columns, rows, [r.model_dump(mode="json") for r in found], as_json)
