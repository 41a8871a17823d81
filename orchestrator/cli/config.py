"""`clawq config …`: the live configuration for people (what the gateway tool does for
agents): get, apply (validated, with a diff, --dry-run), history, rollback."""

from __future__ import annotations

import getpass
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import click
import psycopg
import redis

from broker.config.live import TOPIC, ConfigError, LiveConfigStore, diff, validate
from broker.config.loading import masked, origins
from broker.config.settings import Settings, setting_names
from broker.pg.store import Store
from broker.redis import changes
from orchestrator.cli.common import database, json_option, settings_from_env, table


@contextmanager
def opened() -> Iterator[tuple[Settings, LiveConfigStore]]:
    try:
        with database() as (settings, store):
            yield settings, LiveConfigStore(store.conn)
    except ConfigError as exc:
        raise click.UsageError(f"refused: {exc.field}: {exc.message}") from None


def _announce(settings: Settings) -> None:
    with redis.Redis.from_url(settings.redis_url) as client:
        changes.announce(client, TOPIC)


@click.group()
def config() -> None:
    """Settings: what is in force (`show`), and the live configuration, versioned in
    PostgreSQL over the environment and the config file."""


def _live_config(settings: Settings) -> tuple[int, dict[str, Any]]:
    """The applied live configuration, or none (with a line that says why) when the
    database cannot be read."""
    store = None
    try:
        store = Store(settings.database_url)
        store.migrate()
        current = LiveConfigStore(store.conn).current()
    except (psycopg.Error, OSError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        click.echo(f"live configuration not read (PostgreSQL: {reason})", err=True)
        return 0, {}
    finally:
        if store is not None:
            store.close()
    return (current.version, current.config) if current else (0, {})


@config.command("show")
@json_option
def show(as_json: bool) -> None:
    """Every setting in force and where it comes from: env, a config file, default, or
    live (the applied live configuration, over the others)."""
    settings = settings_from_env()
    found = origins()
    version, live = _live_config(settings)
    values = settings.model_dump(mode="json")
    rows = []
    for name in setting_names():
        value, origin = values[name], found[name]
        if name in live:
            value, origin = live[name], f"live (version {version})"
        rows.append((name, masked(name, value), origin))
    table(
        ("setting", "value", "source"),
        [(n, v if isinstance(v, str) else json.dumps(v), o) for n, v, o in rows],
        [{"setting": n, "value": v, "source": o} for n, v, o in rows],
        as_json,
    )


@config.command("get")
def get() -> None:
    """The applied version and its keys (JSON)."""
    with opened() as (_, store):
        current = store.current()
    click.echo(
        json.dumps(
            {
                "version": current.version if current else 0,
                "config": current.config if current else {},
            }
        )
    )


@config.command("apply")
@click.argument("source", type=click.File("r"))
@click.option("--dry-run", is_flag=True, help="Show the diff; store nothing.")
@click.option("--note", default="", help="Why.")
def apply(source: IO[str], dry_run: bool, note: str) -> None:
    """Apply SOURCE (a JSON file, or - for stdin) over the applied configuration."""
    try:
        given = json.loads(source.read())
    except json.JSONDecodeError as exc:
        raise click.UsageError(f"not JSON: {exc}") from None
    with opened() as (settings, store):
        current = store.current()
        applied = current.config if current else {}
        merged = {**applied, **given} if isinstance(given, dict) else given
        validate(settings, merged)
        for line in diff(applied, merged):
            click.echo(line)
        if dry_run:
            click.echo("dry run: nothing stored", err=True)
            return
        version = store.apply(settings, merged, getpass.getuser(), note)
        _announce(settings)
    click.echo(f"applied version {version}", err=True)


@config.command("history")
@json_option
def history(as_json: bool) -> None:
    """Every version, newest first."""
    with opened() as (_, store):
        versions = store.history(100)
    rows = [
        (v.version, v.status, v.applied_by, v.created_at, json.dumps(v.config), v.note)
        for v in versions
    ]
    table(
        ("version", "status", "by", "at", "config", "note"),
        rows,
        [v.model_dump(mode="json") for v in versions],
        as_json,
    )


@config.command("rollback")
@click.option("--to", "to", type=int, default=None, help="This version (default: the one before).")
def rollback(to: int | None) -> None:
    """Make an earlier version the one in force (as a new version)."""
    with opened() as (settings, store):
        version = store.rollback(getpass.getuser(), to)
        _announce(settings)
    click.echo(f"version {version} is in force", err=True)


@click.command("secret-key")
def secret_key() -> None:
    """Print a new CLAWQ_SECRET_KEY (base64 of 32 random bytes) for sealing secrets."""
    from broker.config.secretbox import new_key

    click.echo(new_key())
