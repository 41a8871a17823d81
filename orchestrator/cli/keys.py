"""`clawq keys …`: API keys of the HTTP API (talks to PostgreSQL directly: an operator's
command, not an API call)."""

from __future__ import annotations

import getpass
from collections.abc import Iterator
from contextlib import contextmanager

import click

from broker.stores.api_keys import ApiKeyStore
from orchestrator.cli.common import database, diagnostics, json_option, table


@contextmanager
def key_store() -> Iterator[ApiKeyStore]:
    with database() as (_, store):
        yield ApiKeyStore(store)


@click.group()
def keys() -> None:
    """API keys: create (printed once), list, revoke."""


@keys.command("create")
@click.option("--user", required=True, help="The user the key acts as.")
@click.option(
    "--agent",
    "agents",
    multiple=True,
    default=("main",),
    show_default=True,
    help="An agent the key may run (repeat for more); an admin's key runs any.",
)
@click.option("--admin", is_flag=True, help="May administer: configuration, MCP, custom tools.")
@click.option("--name", default="", help="A label, e.g. where the key is used.")
def create(user: str, agents: tuple[str, ...], admin: bool, name: str) -> None:
    """Create a key and print it: the only time it is shown."""
    with key_store() as store:
        try:
            made, secret = store.create(user, admin, name, by=getpass.getuser(), agents=agents)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    click.echo(secret)
    role = " (admin)" if admin else f" (agents {', '.join(made.agents)})"
    diagnostics.print(f"key {made.id} for user {user}{role}: keep it now")


@keys.command("list")
@json_option
def list_keys(as_json: bool) -> None:
    """Every key, without its secret."""
    with key_store() as store:
        found = store.list()
    rows = [
        (
            k.id,
            k.user_id,
            k.admin,
            ",".join(k.agents),
            k.name,
            k.created_at,
            "revoked" if k.revoked_at else "live",
        )
        for k in found
    ]
    records = [k.model_dump(mode="json") for k in found]
    columns = ("id", "user", "admin", "agents", "name", "created", "status")
    table(columns, rows, records, as_json)


@keys.command("revoke")
@click.argument("key_id")
def revoke(key_id: str) -> None:
    """Revoke a key at once: every later request with it gets 401."""
    with key_store() as store:
        if not store.revoke(key_id):
            raise click.UsageError(f"no live key {key_id}")
    click.echo(f"revoked {key_id}")
