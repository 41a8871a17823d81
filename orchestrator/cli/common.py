"""What every command shares: its settings (the environment, else a running `clawq up`),
its logging, and what it prints.

What the CLI prints. Data goes to stdout: a table, or JSON with `--json`; diagnostics
(progress, events, confirmations of what was done) go to stderr.

A table on a terminal is drawn by rich; into a pipe it is plain columns, padded but never
cut, so `clawq mcp tools | grep x` sees whole names and `awk` sees whole fields.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import click
from rich.console import Console
from rich.table import Table

from broker.config.settings import Settings
from broker.errors import RequestError, Unavailable
from broker.pg.store import Store
from broker.protocol import Group

if TYPE_CHECKING:
    from orchestrator.client import LocalClient

diagnostics = Console(stderr=True, soft_wrap=True)  # a line is never cut in two
F = TypeVar("F", bound=Callable[..., Any])


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return str(value)


def table(
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    records: Any = None,
    as_json: bool = False,
) -> None:
    """Print rows under `columns`; with `as_json`, `records` (or the rows as objects)."""
    rows = [list(map(_cell, row)) for row in rows]
    if as_json:
        data = (
            records if records is not None else [dict(zip(columns, r, strict=True)) for r in rows]
        )
        click.echo(json.dumps(data, default=str))
        return
    if sys.stdout.isatty():
        drawn = Table(*columns)
        for row in rows:
            drawn.add_row(*row)
        Console().print(drawn)
        return
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    for line in [list(columns), *rows]:
        click.echo("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())


def json_option(fn: Any) -> Any:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(
        fn
    )


URL_VARS = ("CLAWQ_REDIS_URL", "CLAWQ_DATABASE_URL")


def services_configured() -> bool:
    """Whether Redis or PostgreSQL is named (environment or config file): else the local
    commands run on embedded ones."""
    from broker.config.loading import DEFAULT, origins

    found = origins()
    return found["redis_url"] != DEFAULT or found["database_url"] != DEFAULT


def settings_for(urls: dict[str, str]) -> Settings:
    """Settings on the given service URLs (embedded ones), else as configured."""
    from broker.config.loading import load_settings

    if not urls:
        return settings_from_env()
    return load_settings(redis_url=urls["CLAWQ_REDIS_URL"], database_url=urls["CLAWQ_DATABASE_URL"])


def settings_from_env() -> Settings:
    """Settings for a command talking to a cluster: as configured (environment, config
    file), on the services of a running `clawq up` when none are named."""
    from broker.config.loading import load_settings
    from orchestrator.cli.local.state import find

    if not services_configured() and (state := find()) is not None:
        return settings_for(state.env())
    return load_settings()


def log_option(fn: Any) -> Any:
    return click.option(
        "--log-level",
        default="info",
        show_default=True,
        type=click.Choice(["debug", "info", "warning", "error"]),
    )(fn)


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )


def where(url: str) -> str:
    """host:port of a service URL, or its socket folder, without its credentials."""
    parts = urlsplit(url)
    if not parts.hostname and (socket := parse_qs(parts.query).get("host")):
        return socket[0]
    host = parts.hostname or "localhost"
    return f"{host}:{parts.port}" if parts.port else host


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextmanager
def reachable(settings: Settings) -> Iterator[None]:
    """Redis or PostgreSQL away (stopped, never started, a wrong URL) is one line that says
    which and what to do, never a traceback."""
    import psycopg
    import redis

    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise Unavailable(
            f"Redis at {where(settings.redis_url)} is unreachable ({first_line(exc)}): start"
            " the stack (clawq up) or name it (CLAWQ_REDIS_URL)"
        ) from None
    except psycopg.OperationalError as exc:
        raise Unavailable(
            f"PostgreSQL at {where(settings.database_url)} is unreachable ({first_line(exc)}):"
            " start the stack (clawq up) or name it (CLAWQ_DATABASE_URL)"
        ) from None


@contextmanager
def refused_as_usage() -> Iterator[None]:
    """A refused request is one line on stderr that says what to change, never a traceback."""
    try:
        yield
    except RequestError as exc:
        raise click.UsageError(str(exc)) from None


@contextmanager
def cluster() -> Iterator[LocalClient]:
    """The client of the cluster this command talks to (see `settings_from_env`)."""
    from orchestrator.client import LocalClient

    settings = settings_from_env()
    with reachable(settings), LocalClient(settings) as client, refused_as_usage():
        yield client


@contextmanager
def database() -> Iterator[tuple[Settings, Store]]:
    """The settings and the migrated store of the cluster this command talks to: for the
    operator's commands that read PostgreSQL directly (keys, config, dlq, memory)."""
    settings = settings_from_env()
    with reachable(settings):
        store = Store(settings.database_url)
        try:
            store.migrate()
            yield settings, store
        finally:
            store.close()


def group_option(help: str) -> Callable[[F], F]:
    """`--group G`: one of the tool groups."""
    return click.option(
        "--group", "group", required=True, type=click.Choice([g.value for g in Group]), help=help
    )
