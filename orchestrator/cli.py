"""The `clawq` command line."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from broker.messages import Event, Group, JobResult
from broker.settings import Settings
from orchestrator import output

console = output.diagnostics
URL_VARS = ("CLAWQ_REDIS_URL", "CLAWQ_DATABASE_URL")


def settings_for(urls: dict[str, str]) -> Settings:
    """Settings on the given service URLs (embedded ones), else from the environment."""
    if not urls:
        return settings_from_env()
    return Settings(redis_url=urls["CLAWQ_REDIS_URL"], database_url=urls["CLAWQ_DATABASE_URL"])


def settings_from_env() -> Settings:
    """Settings for a command talking to a cluster: the environment, else a running
    embedded stack started by `clawq up`, else the local default services."""
    from broker.embedded import read_state

    if not any(os.environ.get(v) for v in URL_VARS):
        state = read_state()
        if state:
            return settings_for(state)
    return Settings()


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


@click.group()
def main() -> None:
    """clawq: distributed tool execution for AI agents, on Celery."""


@main.command()
@click.option(
    "--group",
    "group",
    required=True,
    type=click.Choice([g.value for g in Group]),
    help="Tool group whose queue this worker consumes.",
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
    """Run a Celery worker executing the tools of one group (any number, on any host)."""
    from workers.main import run_worker
    from workers.registry import default_registry
    from workers.tools.web.providers import SearchConfigError

    try:
        run_worker(settings_from_env(), default_registry(), group, concurrency, pool, log_level)
    except SearchConfigError as exc:  # a configuration error: say it, start nothing
        raise click.ClickException(str(exc)) from None


@main.command()
@log_option
def orchestrator(log_level: str) -> None:
    """Run an orchestrator: consumes the `agents` queue and drives agent loops."""
    from orchestrator.engine import serve

    setup_logging(log_level)
    serve(settings_from_env())


@main.command()
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


@main.command("secret-key")
def secret_key() -> None:
    """Print a new CLAWQ_SECRET_KEY (base64 of 32 random bytes) for sealing secrets."""
    from broker.secretbox import new_key

    click.echo(new_key())


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


@main.command()
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
    from broker.embedded import EmbeddedServices, write_state
    from orchestrator.stack import Stack

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


@main.command()
@output.json_option
def status(as_json: bool) -> None:
    """List the live orchestrators and workers, per queue; warn when the broker's Redis
    would lose work (no append-only file, or keys it may evict)."""
    import redis

    from broker.presence import live_processes

    settings = settings_from_env()
    client = redis.Redis.from_url(settings.redis_url)
    live = live_processes(client)
    report: dict[str, Any] = {
        "orchestrators": sorted(
            (p for p in live if p.get("kind") == "orchestrator"), key=lambda p: p["id"]
        ),
        "queues": {},
    }
    for proc in sorted((p for p in live if p.get("kind") == "worker"), key=lambda p: p["id"]):
        report["queues"].setdefault(proc["queue"], []).append(proc)
    from broker import keys

    found: dict[bytes, bytes] = client.hgetall(keys.CALLS_WAITING)  # type: ignore[assignment]
    waiting = [json.loads(v) | {"call": k.decode()} for k, v in found.items()]
    report["waiting"] = waiting
    rows = [("orchestrator", "agents", p["id"], "", "") for p in report["orchestrators"]]
    rows += [
        ("worker", queue, p["id"], p.get("node", ""), p.get("confinement", ""))
        for queue, procs in report["queues"].items()
        for p in procs
    ]
    rows += [
        ("waiting call", w["queue"], w["call"], f"{time.time() - w['since']:.0f} s", w["tool"])
        for w in sorted(waiting, key=lambda w: w["since"])
    ]
    from broker.redis_config import redis_warnings

    report["redis"], warnings = redis_warnings(client)
    report["redis"]["warnings"] = warnings
    output.table(("kind", "queue", "process", "node", "confinement"), rows, report, as_json)
    if waiting:
        click.echo(f"{len(waiting)} calls wait for a worker: start one for their queue", err=True)
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)


def result_json(result: JobResult) -> dict[str, Any]:
    return {
        "job_id": result.job_id,
        "status": result.status,
        "final_text": result.final_text,
        "iterations": result.iterations,
        "error": result.error,
        "tool_calls": [c.model_dump() for c in result.tool_calls],
        "usage": result.usage.model_dump() if result.usage else None,
    }


ANSWER_KEYS = {"o": "allow-once", "a": "allow-always", "d": "deny"}


def ask_inline(job: Any, event: Event) -> None:
    """Ask the person at the terminal, as Claude Code does, and send the answer."""
    from orchestrator.client import ClientError

    d = event.data
    console.print(f"  [dim]input:[/] {escape(json.dumps(d['input'])[:400])}")
    choice = click.prompt(
        "  allow [o]nce, allow [a]lways, or [d]eny?",
        type=click.Choice(list(ANSWER_KEYS)),
        show_choices=False,
        err=True,
    )
    try:
        job.approve(d["request_id"], ANSWER_KEYS[choice])
    except ClientError as exc:  # e.g. it timed out while the person thought
        console.print(f"[red]{escape(str(exc))}[/]")


def show_event(event: Event, interactive: bool = False) -> None:
    d = event.data
    if event.type == "tool_call_queued":
        args = escape(json.dumps(d["input"])[:120])
        console.print(f"[cyan]→ {d['name']}[/] {args} [dim]({d['queue']})[/]")
    elif event.type == "tool_call_finished":
        mark = "[red]✗[/]" if d["is_error"] else "[green]✓[/]"
        first = d["output"].splitlines()[0][:100] if d["output"] else ""
        console.print(f"{mark} {d['name']} [dim]{d['worker']}[/] {escape(first)}")
    elif event.type == "model_text":
        console.print(f"[bold]model:[/] {escape(d['text'])}")
    elif event.type == "tool_call_denied":
        console.print(f"[red]✗ {d['name']} refused[/] [dim]({d['layer']})[/] {escape(d['reason'])}")
    elif event.type == "approval_requested":
        console.print(f"[yellow]? {d['name']} needs approval[/]: {escape(d['reason'])}")
        if not interactive:
            console.print(
                f"  clawq approve {event.job_id} {d['request_id']} allow-once|allow-always|deny"
            )
    elif event.type == "job_finished":
        error = escape(d.get("error") or "")
        console.print(f"[bold]{d['status']}[/] after {d['iterations']} turns {error}")


@main.command()
@click.argument("prompt")
@click.option(
    "--model",
    default="scripted",
    show_default=True,
    help="scripted, openai[:name] or anthropic[:name]",
)
@click.option(
    "--script",
    "script_file",
    type=click.Path(exists=True, dir_okay=False),
    help="JSON script for the scripted model.",
)
@click.option("--workspace", type=click.Path(file_okay=False), default=".", show_default=True)
@click.option("--allow", multiple=True, help="Allow rule, e.g. exec or 'exec(git *)' (repeatable).")
@click.option(
    "--ask",
    multiple=True,
    help="Ask rule: such calls wait for an answer (asked here on a terminal, or clawq approve).",
)
@click.option("--deny", multiple=True, help="Deny rule, e.g. 'read_file(./secrets/**)'.")
@click.option(
    "--permission-mode",
    default="default",
    show_default=True,
    type=click.Choice(["default", "acceptEdits", "plan", "bypassPermissions"]),
)
@click.option("--max-iterations", type=int, default=None)
@click.option("--timeout", type=float, default=600.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def run(
    prompt: str,
    model: str,
    script_file: str | None,
    workspace: str,
    allow: tuple[str, ...],
    ask: tuple[str, ...],
    deny: tuple[str, ...],
    permission_mode: str,
    max_iterations: int | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Submit a job to the configured cluster, show its events, print the result."""
    from orchestrator.client import Client, ClientError

    script = json.loads(Path(script_file).read_text()) if script_file else None
    with Client(settings_from_env()) as client:
        try:
            job = client.submit(
                prompt,
                model=model,
                script=script,
                workspace=os.path.abspath(workspace),
                allow=allow,
                ask=ask,
                deny=deny,
                permission_mode=permission_mode,
                max_iterations=max_iterations,
            )
        except ClientError as exc:
            raise click.UsageError(str(exc)) from None
        if not as_json:
            interactive = sys.stdin.isatty()  # a person is there: ask inline
            console.print(f"job {job.id}")
            for event in job.events():
                show_event(event, interactive)
                if interactive and event.type == "approval_requested":
                    ask_inline(job, event)
        result = job.wait(timeout=timeout)
    if as_json:
        click.echo(json.dumps(result_json(result)))
    else:
        click.echo(result.final_text or result.error)
        if result.usage is not None:  # the whole tree's, with its subagents
            u = result.usage
            cost = f", ${u.cost_usd:.4f}" if u.cost_usd else ""
            console.print(f"usage: {u.turns} model turns, {u.tokens} tokens{cost}")
    sys.exit(0 if result.status == "completed" else 1)


@main.command()
@click.argument("job_id")
@click.argument("request_id")
@click.argument("decision", type=click.Choice(["allow-once", "allow-always", "deny"]))
@click.option("--by", default="", help="Who answers (default: this user).")
def approve(job_id: str, request_id: str, decision: str, by: str) -> None:
    """Answer a job's approval request (see its approval_requested event)."""
    from orchestrator.client import Client, ClientError

    with Client(settings_from_env()) as client:
        try:
            client.job(job_id).approve(request_id, decision, by=by)
        except ClientError as exc:
            raise click.UsageError(str(exc)) from None
    console.print(f"{decision} sent for {request_id}")


@main.command()
@click.argument("job_id")
@click.argument("message")
def steer(job_id: str, message: str) -> None:
    """Redirect a running job: stop its current work and go on with MESSAGE."""
    from orchestrator.client import Client, ClientError

    with Client(settings_from_env()) as client:
        try:
            client.job(job_id).steer(message)
        except ClientError as exc:
            raise click.UsageError(str(exc)) from None
    console.print(f"steered {job_id}")


@main.command()
@click.argument("job_id")
def cancel(job_id: str) -> None:
    """Cancel a job: no further model turns; it ends `cancelled`."""
    from orchestrator.client import Client

    with Client(settings_from_env()) as client:
        client.job(job_id).cancel()
    console.print(f"cancel requested for {job_id}")


@main.command()
@click.option("--port", default=5555, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True)
def flower(port: int, address: str) -> None:
    """Run Flower, the Celery dashboard, on this cluster's broker."""
    from broker.celery_app import create_app

    app = create_app(settings_from_env())
    app.start(["flower", f"--port={port}", f"--address={address}"])


@main.command()
@click.option("--workers", "workers_per_group", default=1, show_default=True)
def demo(workers_per_group: int) -> None:
    """Run a bundled scripted job across real worker processes, then shut everything down."""
    from broker.embedded import EmbeddedServices
    from orchestrator.client import Client
    from orchestrator.stack import Stack

    services = None
    env: dict[str, str] = {}
    if not any(os.environ.get(v) for v in URL_VARS):
        console.print("starting embedded Redis and PostgreSQL…")
        services = EmbeddedServices.start()
        env = services.env()
    settings = settings_for(env)
    script = json.loads((resources.files("orchestrator") / "demo_script.json").read_text())
    stack = Stack(_groups(), workers_per_group, env=env, api=True)
    ok = False
    try:
        stack.start()
        stack.wait_ready(settings.redis_url)
        console.print("[green]stack up[/]: orchestrator + workers for " + ", ".join(stack.groups))
        with (
            tempfile.TemporaryDirectory(prefix="clawq-demo-") as workspace,
            Client(settings) as client,
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
            output.table(
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


def _add_subcommands() -> None:
    from orchestrator.cli_config import config
    from orchestrator.cli_dlq import dlq
    from orchestrator.cli_keys import keys
    from orchestrator.cli_mcp import mcp
    from orchestrator.cli_memory import context, memory
    from orchestrator.cli_ops import health, migrate
    from orchestrator.cli_tools import tools

    main.add_command(config)
    main.add_command(dlq)
    main.add_command(memory)
    main.add_command(context)
    main.add_command(mcp)
    main.add_command(tools)
    main.add_command(keys)
    main.add_command(health)
    main.add_command(migrate)


_add_subcommands()

if __name__ == "__main__":
    main()
