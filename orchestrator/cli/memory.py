"""`clawq memory …` and `clawq context …`: what operators do with memory and context
files (status, reindex, search; an agent's kind and its files)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Literal

import click

from broker.config.settings import Settings
from broker.stores.context_files import CONTEXT_FILES, ContextFileStore, VersionConflict
from broker.stores.memory import MemoryStore
from orchestrator.cli.common import database, json_option, table


@contextmanager
def opened() -> Iterator[tuple[Settings, MemoryStore, ContextFileStore]]:
    with database() as (settings, store):
        yield settings, MemoryStore(store.conn), ContextFileStore(store.conn)


def routed_files_changed(settings: Settings, agent: str) -> None:
    """Workers list the agent's files from PostgreSQL again (a new token for their
    caches); without Redis they do within `list_cache_s`."""
    import redis

    from workers.tools.fs.listing_cache import changed

    try:
        with redis.Redis.from_url(settings.redis_url) as client:
            changed(client, agent)
    except redis.RedisError as exc:
        click.echo(
            f"warning: Redis unreachable ({exc}): listings may show the old files for "
            f"{settings.list_cache_s:g} s",
            err=True,
        )


@click.group()
def memory() -> None:
    """Memory documents (MEMORY.md, memory/**) and their search index."""


@memory.command("status")
@json_option
def status(as_json: bool) -> None:
    """Documents, chunks, embeddings, what waits to be indexed, and recent failures."""
    from workers.tools.memory import embed

    with opened() as (settings, store, _):
        report = store.status()
        report["embedder"] = embed.choose(settings)
    if as_json:
        click.echo(json.dumps(report, default=str))
        return
    for key in ("embedder", "features", "documents", "indexed", "pending", "chunks", "embedded"):
        click.echo(f"{key:<10} {report[key]}")
    for row in report["models"]:
        click.echo(f"model      {row['model']}: {row['chunks']} chunks")
    if report["errors"]:
        click.echo("failures:")
        table(
            ("agent", "user", "path", "error"),
            [
                (e["agent_id"], e["user_id"] or "(global)", e["path"], e["index_error"])
                for e in report["errors"]
            ],
        )


@memory.command("reindex")
@click.option("--agent", default=None, help="Only this agent's documents.")
def reindex(agent: str | None) -> None:
    """Index every markdown memory document again (after changing the embedder)."""
    from broker.celery.app import create_app
    from workers.tools.memory.index import INDEX_TASK

    with opened() as (settings, store, _):
        count = store.requeue_all(agent)
        app = create_app(settings)
        for doc in store.documents(agent):
            if doc.path.endswith(".md"):
                app.send_task(INDEX_TASK, args=[doc.id], queue="memory")
    click.echo(f"queued {count} documents for indexing", err=True)


@memory.command("search")
@click.argument("query")
@click.option("--agent", default="main", show_default=True)
@click.option("--user", default="", help="A user id (default: the agent's global memory).")
@click.option("--max-results", type=int, default=None)
@json_option
def search_command(
    query: str, agent: str, user: str, max_results: int | None, as_json: bool
) -> None:
    """Search as memory_search would for a job of this agent and user."""
    from workers.tools.memory.search import search

    with opened() as (settings, store, _):
        hits = search(store, agent, user, query, settings, max_results)
    rows = [
        (f"{h.score:.3f}", f"{h.path}:{h.start_line}-{h.end_line}", h.scope, h.snippet[:80])
        for h in hits
    ]
    table(("score", "where", "scope", "snippet"), rows, [h.__dict__ for h in hits], as_json)


@click.group()
def context() -> None:
    """Context files (SOUL.md, IDENTITY.md, …) of an agent and its users."""


@context.command("kind")
@click.argument("agent")
@click.argument("kind", type=click.Choice(["open", "predefined"]), required=False)
def kind(agent: str, kind: Literal["open", "predefined"] | None) -> None:
    """Show or set an agent's kind: open (files per user) or predefined (the agent's)."""
    with opened() as (_, _m, files):
        if kind:
            files.set_kind(agent, kind)
        click.echo(files.kind(agent))


@context.command("set")
@click.argument("agent")
@click.argument("name", type=click.Choice(CONTEXT_FILES))
@click.argument("source", type=click.File("r"))
@click.option("--user", default="", help="The user's copy (default: the agent's own).")
def set_file(agent: str, name: str, source: IO[str], user: str) -> None:
    """Set a context file from SOURCE (a file, or - for stdin)."""
    content = source.read()
    with opened() as (settings, _m, files):
        current = files.version(agent, user, name)
        try:
            version = files.put(agent, user, name, content, current)
        except VersionConflict:
            raise click.ClickException(f"{name} changed meanwhile; run again") from None
        routed_files_changed(settings, agent)
    click.echo(f"{name} of {agent}{' for ' + user if user else ''}: version {version}", err=True)


@context.command("show")
@click.argument("agent")
@click.argument("name", type=click.Choice(CONTEXT_FILES))
@click.option("--user", default="", help="What this user sees (their copy or the agent's).")
def show(agent: str, name: str, user: str) -> None:
    """Print a context file as a job of this agent and user reads it."""
    with opened() as (_, _m, files):
        found = files.get(agent, user, name) or (files.get(agent, "", name) if user else None)
    if found is None:
        raise click.ClickException(f"{agent} has no {name}")
    sys.stdout.write(found.content)


@context.command("list")
@click.argument("agent")
@json_option
def list_files(agent: str, as_json: bool) -> None:
    """Every context file of the agent and of its users."""
    with opened() as (_, _m, files):
        found = files.all_of(agent)
    rows = [(f.name, f.user_id or "(agent)", f.version, len(f.content)) for f in found]
    records = [f.model_dump() for f in found]
    table(("name", "user", "version", "chars"), rows, records, as_json)
