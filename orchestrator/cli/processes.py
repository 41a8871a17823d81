"""Running each process of a cluster: `clawq worker`, `orchestrator`, `api`, `flower`."""

from __future__ import annotations

import click

from broker.protocol import Group
from orchestrator.cli.common import log_option, settings_from_env, setup_logging


def _groups(ctx: click.Context, param: click.Parameter, value: str) -> str:
    known = [g.value for g in Group]
    unknown = [g for g in value.split(",") if g not in known]
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}: not a group (groups: {', '.join(known)})")
    return value


@click.command()
@click.option(
    "--group",
    required=True,
    callback=_groups,
    help="The tool group whose queue this worker consumes, or several light ones"
    " (fs,sessions,memory); runtime, web and ui each need their own.",
)
@click.option("--concurrency", type=int, default=None, help="Executing processes/threads.")
@click.option(
    "--pool",
    type=click.Choice(["direct", "prefork", "threads", "solo"]),
    default=None,
    help="direct (the default): N processes that each take their own calls.",
)
@log_option
def worker(group: str, concurrency: int | None, pool: str | None, log_level: str) -> None:
    """Run a Celery worker executing the tools of a group (any number, on any host)."""
    from workers.main import run_worker
    from workers.registry import default_registry

    run_worker(settings_from_env(), default_registry(), group, concurrency, pool, log_level)


@click.command()
@log_option
def orchestrator(log_level: str) -> None:
    """Run an orchestrator: consumes the `agents` queue and drives agent loops."""
    from orchestrator.engine import serve

    setup_logging(log_level)
    serve(settings_from_env())


@click.command()
@click.option("--host", default=None, help="Address to listen on (default CLAWQ_API_HOST).")
@click.option("--port", type=int, default=None, help="Port (default CLAWQ_API_PORT, 8420).")
@log_option
def api(host: str | None, port: int | None, log_level: str) -> None:
    """Run the HTTP API (FastAPI on uvicorn); docs at /docs, OpenAPI at /openapi.json."""
    from orchestrator.api.serve import ExposureError, serve

    settings = settings_from_env()
    try:
        serve(settings, host or settings.api_host, port or settings.api_port, log_level)
    except ExposureError as exc:
        raise click.ClickException(str(exc)) from None


@click.command()
@click.option("--port", default=5555, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True)
def flower(port: int, address: str) -> None:
    """Run Flower, the Celery dashboard, on this cluster's broker."""
    from broker.celery.app import create_app

    app = create_app(settings_from_env())
    app.start(["flower", f"--port={port}", f"--address={address}"])
