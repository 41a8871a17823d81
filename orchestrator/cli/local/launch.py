"""What the local stack starts and what it says: the workers (the light groups share one,
runtime, web and ui have their own), their output in a log file unless `-v`, one line per
process started, the superuser warning explained once."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import IO

import click

from broker.config.loading import DEFAULT, origins
from broker.config.settings import Settings
from broker.config.sources import home
from broker.protocol import Group
from orchestrator.cli.common import diagnostics as console
from orchestrator.cli.local.stack import Stack

ALONE = (Group.runtime.value, Group.web.value, Group.ui.value)  # as workers/main.py says
LOCAL_CONCURRENCY = "2"  # processes of a direct worker here, unless configured


def groups(settings: Settings) -> list[str]:
    """Every group with tools, and mcp (its tools come from the servers configured); ui
    only where Chromium is installed."""
    from workers.registry import default_registry

    found = [g.value for g in default_registry().groups()] + [Group.mcp.value]
    executable = settings.browser_executable
    if Group.ui.value in found and not os.path.exists(executable):
        click.echo(
            f"no Chromium at {executable}: starting no ui worker (the browser tool will not"
            " answer); install chromium or set CLAWQ_BROWSER_EXECUTABLE",
            err=True,
        )
        found.remove(Group.ui.value)
    return found


def layout(found: list[str]) -> list[str]:
    """The workers: one for every light group together, one each for runtime, web, ui."""
    light = [g for g in found if g not in ALONE]
    return ([",".join(light)] if light else []) + [g for g in found if g in ALONE]


def child_env() -> dict[str, str]:
    """What the stack's processes get beyond this one's environment: two processes per
    direct worker (not the four of a production default) unless configured."""
    if origins()["worker_concurrency"] == DEFAULT:
        return {"CLAWQ_WORKER_CONCURRENCY": LOCAL_CONCURRENCY}
    return {}


def log_file(data: Path | None) -> Path:
    """Where the processes' output goes: beside kept data, else under ~/.clawq/logs."""
    folder = data if data is not None else home() / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "up.log"


def open_log(path: Path) -> IO[bytes]:
    log = path.open("ab")
    log.write(f"\n--- clawq up, pid {os.getpid()}, {time.ctime()} ---\n".encode())
    log.flush()
    return log


def quiet_here() -> None:
    """Warnings of libraries that say nothing a user can act on (pgserver's runtime dir)."""
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")


def superuser_note() -> None:
    if os.geteuid() == 0:
        console.print(
            "running as root: Celery's superuser warning is silenced in the workers (they"
            " accept JSON only, never pickle); a user of its own gives the tools less to reach",
            soft_wrap=True,
            markup=False,
        )


def migrated(settings: Settings) -> None:
    """The schema before any process starts: an orchestrator's sweeps read it from their
    first tick, and the API, which also migrates, starts beside them."""
    from broker.pg.store import Store

    store = Store(settings.database_url)
    try:
        store.migrate()
    finally:
        store.close()


def announce(stack: Stack) -> None:
    """One line per process started."""
    for index, proc in enumerate(stack.procs):
        console.print(f"started {stack.name(index)} (pid {proc.pid})", markup=False)
