"""`clawq dlq …`: the dead letters (broker/stores/dead_letters.py): list, show, retry, purge."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager

import click
import redis

from broker import keys
from broker.config.settings import Settings
from broker.protocol import CallEnvelope
from broker.stores.dead_letters import DeadLetter, DeadLetters, outcome_found
from orchestrator.cli.common import database, json_option, table


@contextmanager
def opened() -> Iterator[tuple[Settings, DeadLetters]]:
    with database() as (settings, store):
        yield settings, DeadLetters(store.conn)


@click.group()
def dlq() -> None:
    """Dead letters: calls that used up their deliveries, messages that did not decode."""


@dlq.command("list")
@click.option("--limit", type=int, default=50, show_default=True)
@click.option("--status", type=click.Choice(["dead", "retried"]), default=None)
@json_option
def list_(limit: int, status: str | None, as_json: bool) -> None:
    """The newest dead letters."""
    with opened() as (_, letters):
        found = letters.list(limit, status)
    table(
        ("id", "kind", "status", "queue", "tool", "job", "call", "attempts", "at", "reason"),
        (
            (
                d.id,
                d.kind,
                d.status,
                d.queue,
                d.tool,
                d.job_id[:12],
                d.call_id,
                d.attempts,
                f"{d.created_at:%Y-%m-%d %H:%M:%S}",
                d.reason[:60],
            )
            for d in found
        ),
        records=[d.model_dump(mode="json") for d in found],
        as_json=as_json,
    )


@dlq.command()
@click.argument("letter_id", type=int)
def show(letter_id: int) -> None:
    """One dead letter, whole, as JSON (the envelope as it was received)."""
    with opened() as (_, letters):
        found = _get(letters, letter_id)
    click.echo(json.dumps(found.model_dump(mode="json"), indent=2))


@dlq.command()
@click.argument("letter_id", type=int)
def retry(letter_id: int) -> None:
    """Send a dead call again as it was (a fresh deadline, its ledger entry cleared), unless
    an outcome of it exists (the ledger, a live worker's spool, the stored results)."""
    from broker.celery.app import create_app

    with opened() as (settings, letters):
        found = _get(letters, letter_id)
        if found.kind != "exhausted" or found.envelope is None:
            raise click.UsageError(f"dead letter {letter_id} did not decode: there is no call")
        envelope = CallEnvelope.model_validate(found.envelope).model_copy(
            update={"deadline": time.time() + settings.visibility_timeout_s, "resent": True}
        )
        with redis.Redis.from_url(settings.redis_url) as client:
            if where := outcome_found(client, letters.conn, envelope):
                raise click.ClickException(
                    f"dead letter {letter_id}: {found.tool} not sent again: {where}"
                )
            client.delete(keys.call(envelope.job_id, envelope.turn, envelope.call_id))
        app = create_app(settings)
        app.send_task(
            found.task,
            kwargs={"envelope": envelope.model_dump(mode="json")},
            queue=found.queue,
            task_id=f"{envelope.call_id}.retry-{int(time.time())}",
        )
        letters.mark_retried(letter_id)
    click.echo(f"dead letter {letter_id}: {found.tool} sent again to {found.queue}", err=True)


@dlq.command()
@click.option("--older-than", "older_than_s", type=float, default=None, help="Seconds.")
@click.option("--yes", is_flag=True, help="Do not ask.")
def purge(older_than_s: float | None, yes: bool) -> None:
    """Delete dead letters (all, or those older than a number of seconds)."""
    what = f"older than {older_than_s:g} s" if older_than_s is not None else "all"
    if not yes:
        click.confirm(f"delete {what} dead letters?", abort=True, err=True)
    with opened() as (_, letters):
        gone = letters.purge(older_than_s)
    click.echo(f"{gone} dead letters deleted", err=True)


def _get(letters: DeadLetters, letter_id: int) -> DeadLetter:
    found = letters.get(letter_id)
    if found is None:
        raise click.UsageError(f"there is no dead letter {letter_id}; see clawq dlq list")
    return found
