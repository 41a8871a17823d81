"""A local cluster in one command: `clawq up` (embedded Redis and PostgreSQL unless the
services are named, an orchestrator, workers for every group, the API) and `clawq demo`.

`up` keeps its data (`~/.clawq/data`, `--data DIR`; `--ephemeral` for a throwaway one), so
keys, custom tools, MCP servers, memory and jobs outlive a restart. What would make it fail
later (its data held by another stack, the API's port taken) is refused before anything
starts."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import TypeVar

import click
from rich.markup import escape

from broker.config.loading import DEFAULT, digests, load_settings, origins
from broker.config.settings import Settings
from broker.errors import ClawqError
from orchestrator.cli.common import diagnostics as console
from orchestrator.cli.common import log_option, services_configured, settings_for, table
from orchestrator.cli.jobs import show_event
from orchestrator.cli.local import launch
from orchestrator.cli.local.embedded import EmbeddedServices, ephemeral_folder, free_port
from orchestrator.cli.local.state import DataLock, StackBusy, StackState, default_data, find

T = TypeVar("T")


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _api_port(settings: Settings, may_move: bool) -> int:
    """The API's port: the configured one if free; another free one for a second stack
    (`--data`) when none was configured; else refused, with who holds it if it is ours."""
    if _port_free(settings.api_host, settings.api_port):
        return settings.api_port
    if may_move and origins()["api_port"] == DEFAULT:
        return free_port()
    try:
        holder = find()
    except ClawqError:  # a stale state file says nothing about who holds the port
        holder = None
    ours = holder is not None and holder.api_url.endswith(f":{settings.api_port}")
    by = f" (by clawq up, pid {holder.pid}, data {holder.data})" if holder and ours else ""
    raise StackBusy(
        f"port {settings.api_port} on {settings.api_host} is taken{by}: stop what holds it,"
        " or set CLAWQ_API_PORT (api_port in clawq.toml)"
    )


@contextmanager
def local_services(
    folder: Path | None, check: Callable[[], T]
) -> Iterator[tuple[EmbeddedServices | None, T]]:
    """The configured services, or embedded ones on `folder` (held against a second
    stack; None: a temporary one). `check` runs once the data is held, before anything
    starts: what it refuses stops the command at once."""
    if services_configured():
        yield None, check()
        return
    lock = DataLock(folder or ephemeral_folder())
    lock.acquire()
    services = None
    try:
        checked = check()
        services = EmbeddedServices.start(lock.data, ephemeral=folder is None)
        console.print(f"started Redis (embedded) on {services.redis_url}", markup=False)
        console.print(f"started PostgreSQL (embedded) in {lock.data / 'pgdata'}", markup=False)
        yield services, checked
    finally:
        lock.release()
        if services is not None:
            services.stop()


verbose_option = click.option(
    "-v", "--verbose", is_flag=True, help="The processes' output here, not in the log file."
)


@click.command()
@click.option(
    "--workers",
    "workers_per_group",
    default=1,
    show_default=True,
    help="Worker processes per tool group (the light groups share one).",
)
@click.option(
    "--data",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The embedded services' data (default ~/.clawq/data): a second stack needs its own.",
)
@click.option("--ephemeral", is_flag=True, help="Data in a temporary folder, removed at exit.")
@verbose_option
@log_option
def up(
    workers_per_group: int, data: Path | None, ephemeral: bool, verbose: bool, log_level: str
) -> None:
    """Run a local stack in the foreground: an orchestrator and workers for every group."""
    launch.quiet_here()
    settings = load_settings()
    if services_configured() and (data or ephemeral):
        raise click.UsageError("--data and --ephemeral are for the embedded services; the"
                               " configuration names Redis or PostgreSQL")  # fmt: skip
    if data and ephemeral:
        raise click.UsageError("--data or --ephemeral, not both")
    folder = None if ephemeral else (data or default_data()).expanduser().resolve()
    with local_services(folder, lambda: _api_port(settings, data is not None)) as (services, port):
        env = (services.env() if services else {}) | launch.child_env()
        if port != settings.api_port:
            env["CLAWQ_API_PORT"] = str(port)
        settings = settings_for(env) if services else settings
        api_url = f"http://{settings.api_host}:{port}"
        if services is not None:
            _publish(services, settings, api_url)
        _run(settings, workers_per_group, env, log_level, verbose, folder, api_url)


def _run(
    settings: Settings,
    workers_per_group: int,
    env: dict[str, str],
    log_level: str,
    verbose: bool,
    folder: Path | None,
    api_url: str,
) -> None:
    """The stack's processes, supervised until Ctrl-C or TERM; stopped in order."""
    from orchestrator.cli.local.stack import Stack

    path = launch.log_file(folder)
    log = None if verbose else launch.open_log(path)
    workers = launch.layout(launch.groups(settings))
    stack = Stack(workers, workers_per_group, env=env, log_level=log_level, api=True, log=log)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the stack on TERM too
    launch.superuser_note()
    launch.migrated(settings)
    try:
        stack.start()
        launch.announce(stack)
        stack.wait_ready(settings.redis_url, where=str(path))
        console.print(
            f"[green]stack up[/]: the API on {api_url} (keys: clawq keys create --user U);"
            f" the processes' output in {path if log else 'this terminal'}. Ctrl-C stops it."
        )
        while True:  # a process that dies is restarted, with a backoff
            stack.supervise(lambda line: console.print(f"[yellow]{escape(line)}[/]"))
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        console.print("stopping: the workers, the orchestrator and the API, then the services")
        stack.stop()
        if log is not None:
            log.close()


def _publish(services: EmbeddedServices, settings: Settings, api_url: str) -> None:
    state = StackState(
        redis_url=services.redis_url,
        database_url=services.database_url,
        pid=os.getpid(),
        data=str(services.directory),
        api_url=api_url,
        settings=digests(settings),
    )
    main = DataLock(services.directory).publish(state)
    kept = "temporary, removed at exit" if services.ephemeral else "kept"
    console.print(f"data: {services.directory} ({kept})")
    if not main:
        console.print(
            f"another stack is the default one: other commands reach this one with"
            f" CLAWQ_DATA={services.directory}"
        )


@click.command()
@click.option("--workers", "workers_per_group", default=1, show_default=True)
@verbose_option
def demo(workers_per_group: int, verbose: bool) -> None:
    """Run a bundled scripted job across real worker processes, then shut everything down."""
    from orchestrator.cli.local.stack import Stack
    from orchestrator.client import LocalClient

    launch.quiet_here()
    load_settings()
    script = json.loads((resources.files("orchestrator.cli") / "demo_script.json").read_text())
    ok = False
    with local_services(None, lambda: None) as (services, _):
        env = (services.env() if services else {}) | launch.child_env()
        env["CLAWQ_API_PORT"] = str(free_port())  # beside any stack already up
        settings = settings_for(env)
        path = launch.log_file(None).with_name("demo.log")
        log = None if verbose else launch.open_log(path)
        workers = launch.layout(launch.groups(settings))
        stack = Stack(workers, workers_per_group, env=env, api=True, log=log)
        launch.superuser_note()
        launch.migrated(settings)
        try:
            stack.start()
            launch.announce(stack)
            stack.wait_ready(settings.redis_url, where=str(path))
            if log is not None:
                console.print(f"stack up; the processes' output in {path}")
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
            if log is not None:
                log.close()
    sys.exit(0 if ok else 1)
