"""A local cluster in one command: `clawq up` (embedded Redis and PostgreSQL unless URLs are
set, an orchestrator, workers for every group, the API) and `clawq demo`."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import click
from rich.markup import escape

from broker.protocol import Group
from orchestrator.cli.common import URL_VARS, log_option, settings_for, settings_from_env, table
from orchestrator.cli.common import diagnostics as console
from orchestrator.cli.jobs import show_event


def _groups() -> list[str]:
    """Every group with tools, and mcp (its tools come from the servers configured); ui
    only where Chromium is installed."""
    from workers.registry import default_registry

    groups = [g.value for g in default_registry().groups()] + [Group.mcp.value]
    executable = settings_from_env().browser_executable
    if Group.ui.value in groups and not os.path.exists(executable):
        click.echo(
            f"no Chromium at {executable}: starting no ui worker (the browser tool will not"
            " answer); install chromium or set CLAWQ_BROWSER_EXECUTABLE",
            err=True,
        )
        groups.remove(Group.ui.value)
    return groups


@click.command()
@click.option(
    "--workers",
    "workers_per_group",
    default=1,
    show_default=True,
    help="Worker processes per tool group.",
)
@log_option
def up(workers_per_group: int, log_level: str) -> None:
    """Run a local stack in the foreground: an orchestrator and workers for every group."""
    from orchestrator.cli.embedded import EmbeddedServices, write_state
    from orchestrator.cli.stack import Stack

    services = None
    env: dict[str, str] = {}
    if not any(os.environ.get(v) for v in URL_VARS):
        services = EmbeddedServices.start()
        env = services.env()
        write_state(services)
        console.print(f"embedded services: {env}")
    settings = settings_for(env)
    stack = Stack(_groups(), workers_per_group, env=env, log_level=log_level, api=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the stack on TERM too
    try:
        stack.start()
        stack.wait_ready(settings.redis_url)
        console.print(
            f"[green]stack up[/]: orchestrator + {workers_per_group} worker(s) for "
            f"{', '.join(stack.groups)}; the API on http://{settings.api_host}:"
            f"{settings.api_port} (keys: clawq keys create --user U). Ctrl-C stops it."
        )
        while True:  # a process that dies is restarted, with a backoff
            stack.supervise(lambda line: console.print(f"[yellow]{escape(line)}[/]"))
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        stack.stop()
        if services:
            services.stop()


@click.command()
@click.option("--workers", "workers_per_group", default=1, show_default=True)
def demo(workers_per_group: int) -> None:
    """Run a bundled scripted job across real worker processes, then shut everything down."""
    from orchestrator.cli.embedded import EmbeddedServices
    from orchestrator.cli.stack import Stack
    from orchestrator.client import LocalClient

    services = None
    env: dict[str, str] = {}
    if not any(os.environ.get(v) for v in URL_VARS):
        console.print("starting embedded Redis and PostgreSQL…")
        services = EmbeddedServices.start()
        env = services.env()
    settings = settings_for(env)
    script = json.loads((resources.files("orchestrator.cli") / "demo_script.json").read_text())
    stack = Stack(_groups(), workers_per_group, env=env, api=True)
    ok = False
    try:
        stack.start()
        stack.wait_ready(settings.redis_url)
        console.print("[green]stack up[/]: orchestrator + workers for " + ", ".join(stack.groups))
        with (
            tempfile.TemporaryDirectory(prefix="clawq-demo-") as workspace,
            LocalClient(settings) as client,
        ):
            job = client.submit(
                "tidy the notes",
                model="scripted",
                script=script,
                workspace=workspace,
                allow=["exec"],
            )
            console.print(f"job {job.id} in workspace {workspace}")
            for event in job.events():
                show_event(event)
            result = job.wait(timeout=60)
            table(
                ("call", "tool", "queue", "worker", "ok"),
                [(c.id, c.name, c.queue, c.worker, not c.is_error) for c in result.tool_calls],
            )
            click.echo((Path(workspace) / "notes/todo.md").read_text())
            ok = result.status == "completed" and not any(c.is_error for c in result.tool_calls)
            click.echo(f"demo {result.status}: {result.final_text}")
    finally:
        stack.stop()
        if services:
            services.stop()
    sys.exit(0 if ok else 1)
