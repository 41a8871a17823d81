"""Jobs from the command line: `clawq run` (submit, follow, answer asks inline), `approve`,
`steer`, `cancel`."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from broker.errors import RequestError, RunError, Unavailable
from broker.protocol import Event, JobResult
from orchestrator.cli.common import cluster, first_line, refused_as_usage
from orchestrator.cli.common import diagnostics as console
from orchestrator.client.deltas import (
    Folder,
    TextDelta,
    TextReset,
    ToolOutputDelta,
    ToolProgress,
)


def result_json(result: JobResult) -> dict[str, Any]:
    return {
        "job_id": result.job_id,
        "session_id": result.session_id,
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
    except RequestError as exc:  # e.g. it timed out while the person thought
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
    elif event.type == "tool_call_progress":
        of = f"/{d['total']:g}" if d.get("total") else ""
        said = escape(d.get("message") or "")
        console.print(f"[dim]… {d['name']} {d['progress']:g}{of}[/] {said}")
    elif event.type == "model_text":
        console.print(f"[bold]model:[/] {escape(d['text'])}")
    elif event.type == "model_failover":
        error = escape(d.get("error") or "")
        console.print(f"[yellow]↷ {d['model']} ({d['credential']}) failed, next:[/] {error}")
    elif event.type == "model_answered":
        console.print(f"[dim]model {d['model']} ({d['credential']}) answered[/]")
    elif event.type == "context_compacted":
        console.print(f"[dim]context: {d['messages']} older messages compacted[/]")
    elif event.type == "loop_warning":
        console.print(f"[yellow]! {d['name']} repeated {d['repeats']} times: model warned[/]")
    elif event.type == "tool_call_denied":
        console.print(f"[red]✗ {d['name']} refused[/] [dim]({d['layer']})[/] {escape(d['reason'])}")
    elif event.type == "approval_requested" and interactive:
        console.print(f"[yellow]? {d['name']} needs approval[/]: {escape(d['reason'])}")
    elif event.type == "job_waiting":
        console.print("[dim]… waiting for people (parked: it resumes when answered)[/]")
    elif event.type == "job_finished":
        error = escape(d.get("error") or "")
        console.print(f"[bold]{d['status']}[/] after {d['iterations']} turns {error}")


class LiveText:
    """The model's text on stderr as it arrives (`model_delta`), instead of one line per
    turn: a turn's text is a paragraph of its own, begun again (↺) when the model was
    asked again; a turn that was not streamed comes whole. A running command's output
    (`tool_output_delta`) is shown line by line as its lines end, and an MCP call's
    progress (`tool_call_progress`) as it is reported."""

    def __init__(self) -> None:
        self.folder = Folder()
        self.open = False  # a paragraph of text is being written
        self.partial: dict[tuple[str, str], str] = {}  # a call's stream: its unended line

    def take(self, event: Event) -> bool:
        """Show what `event` says of the text; whether it was a text or output event."""
        for delta in self.folder.take(event):
            if isinstance(delta, TextReset):
                self.end()
                console.print("[dim]↺ asked again:[/]")
            elif isinstance(delta, ToolOutputDelta):
                key = (delta.call_id, delta.stream)
                *lines, self.partial[key] = (self.partial.get(key, "") + delta.text).split("\n")
                self.lines(lines)
                if delta.truncated:
                    self.lines([self.partial.pop(key), "… (the rest is in its result)"])
            elif isinstance(delta, ToolProgress):
                self.end()
                of = f"/{delta.total:g}" if delta.total else ""
                said = f" {escape(delta.message)}" if delta.message else ""
                console.print(
                    f"  [dim]… {escape(delta.name)} {delta.progress:g}{of}{said}[/]",
                    highlight=False,
                )
            elif isinstance(delta, TextDelta):
                if not self.open:
                    console.print("[bold]model:[/] ", end="")
                    self.open = True
                console.file.write(delta.text)
                console.file.flush()
        if event.type == "model_text":
            self.end()
        if event.type == "tool_call_finished":  # its last line, if it did not end
            for key in [k for k in self.partial if k[0] == event.data.get("call_id")]:
                self.lines([self.partial.pop(key)])
        return event.type in (
            "model_delta",
            "model_text",
            "tool_output_delta",
            "tool_call_progress",
        )

    def lines(self, lines: list[str]) -> None:
        self.end()
        for line in lines:
            if line:
                console.print(f"  [dim]│ {escape(line)}[/]", highlight=False)

    def end(self) -> None:
        if self.open:
            console.file.write("\n")
            console.file.flush()
            self.open = False


def ask_line(event: Event) -> str:
    """One line, never wrapped, for a person elsewhere: what is asked (the whole command of
    an exec), why, when it times out, and the command that answers it."""
    d = event.data
    given = d.get("input") or {}
    if isinstance(given.get("command"), str):
        what = f"{d['name']}({given['command']})"
    else:
        what = f"{d.get('summary') or d['name']} {json.dumps(given)[:300]}"
    timeout = f"; denied in {d['timeout_s']:g}s if unanswered" if d.get("timeout_s") else ""
    line = (
        f"? {what} needs approval ({d['reason']}{timeout}): "
        f"clawq approve {event.job_id} {d['request_id']} allow-once|allow-always|deny"
    )
    return line.replace("\r", "\\r").replace("\n", "\\n")


def question_line(event: Event) -> str:
    """One line for a person elsewhere: the question, its choices, the command that answers."""
    d = event.data
    choices = f" [{'|'.join(d['choices'])}]" if d.get("choices") else ""
    line = f"? {d['question']}{choices}: clawq answer {event.job_id} {d['request_id']} ANSWER"
    return line.replace("\r", "\\r").replace("\n", "\\n")


def on_question(job: Any, event: Event, interactive: bool) -> None:
    """Ask the person at the terminal (a choice, or text), else print the answer line."""
    d = event.data
    if not interactive:
        click.echo(question_line(event), err=True)
        return
    console.print(f"[yellow]? {escape(d['question'])}[/]")
    choices = d.get("choices") or []
    kind = click.Choice(choices) if choices and not d.get("multi") else str
    given = click.prompt("  answer", type=kind, err=True)
    answer = [c.strip() for c in given.split(",")] if d.get("multi") else given
    try:
        job.answer(d["request_id"], answer)
    except RequestError as exc:
        console.print(f"[red]{escape(str(exc))}[/]")


def on_ask(job: Any, event: Event, policy: str, interactive: bool) -> str | None:
    """Answer or announce an approval request as `--on-ask` says; returns why the run
    stops (fail), else None."""
    if policy == "wait" and interactive:
        ask_inline(job, event)
        return None
    click.echo(ask_line(event), err=True)
    if policy == "wait":
        return None
    request = event.data["request_id"]
    with contextlib.suppress(RequestError):  # answered or timed out meanwhile
        job.approve(request, "deny", by="clawq run --on-ask " + policy)
    if policy == "deny":
        return None
    job.cancel()
    name = event.data["name"]
    return (
        f"job {job.id} stopped: {name} needs approval and no one is here to give it; allow"
        f" it beforehand (--allow {name}, or a narrower rule), or run with --on-ask wait"
    )


@contextmanager
def lost_stack(job_id: str) -> Iterator[None]:
    """The stack stopping while `clawq run` follows a job ends it with one line: the job
    is kept and goes on when the stack is back."""
    import psycopg
    import redis

    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError, psycopg.OperationalError) as exc:
        raise Unavailable(
            f"the stack went away while job {job_id} ran ({first_line(exc)}); the job goes on"
            " when it is back (clawq up)"
        ) from None
    except TimeoutError as exc:  # --timeout passed
        raise RunError(f"{exc}: it goes on; raise --timeout to wait longer") from None


def stack_settings_note() -> None:
    """Name each setting given to this command that the running local stack does not have:
    provider and tool settings belong to the stack (its processes read them when `clawq up`
    starts them), so a value given only to `clawq run` would be silently unused."""
    from broker.config.loading import DEFAULT, digests, label, load_settings, origins
    from orchestrator.cli.local.state import find

    state = find()
    if state is None or not state.settings:
        return
    mine = digests(load_settings())
    for name, origin in origins().items():
        if origin == DEFAULT or name in ("redis_url", "database_url"):
            continue
        if state.settings.get(name) != mine[name]:
            console.print(
                f"{label(name, origin)} is not the running stack's: its orchestrator and"
                " workers keep what `clawq up` started with; restart it with this setting"
                " (its data is kept)",
                soft_wrap=True,
                markup=False,
            )


@click.command()
@click.argument("prompt")
@click.option(
    "--model",
    default="scripted",
    show_default=True,
    help="scripted, openai[:name] or anthropic[:name], or a chain tried in order "
    "(anthropic:m1,openai:m2)",
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
@click.option(
    "--mcp-prompt",
    default=None,
    metavar="SERVER:NAME",
    help="An MCP server's prompt (one without arguments) as the job's system prompt.",
)
@click.option("--timeout", type=float, default=600.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option(
    "--live/--no-live",
    default=None,
    help="Print the model's text on stderr as it arrives. Default: when stderr is a"
    " terminal (never with --json).",
)
@click.option(
    "--on-ask",
    "ask_policy",
    type=click.Choice(["wait", "deny", "fail"]),
    default=None,
    help="An approval request: wait for an answer (inline on a terminal, else `clawq"
    " approve`), deny it, or fail (cancel the job, exit 1). Default: wait on a terminal,"
    " fail otherwise. Each ask is printed on stderr at once.",
)
def run(
    prompt: str,
    script_file: str | None,
    workspace: str,
    timeout: float,
    as_json: bool,
    mcp_prompt: str | None,
    ask_policy: str | None,
    live: bool | None,
    **options: Any,
) -> None:
    """Submit a job to the configured cluster, show its events, print the result."""
    script = json.loads(Path(script_file).read_text()) if script_file else None
    terminal = sys.stdin.isatty()
    policy = ask_policy or ("wait" if terminal else "fail")
    stack_settings_note()
    stopped = None
    with cluster() as client:
        with refused_as_usage():
            if mcp_prompt:
                server, _, name = mcp_prompt.partition(":")
                options["system"] = client.mcp.prompt(server, name)
            job = client.submit(
                prompt, script=script, workspace=os.path.abspath(workspace), **options
            )
        if not as_json:
            session = (client.store.job(job.id) or {}).get("session_id", job.id)
            console.print(f"job {job.id}, session {session}", markup=False)
        interactive = terminal and not as_json
        text = (
            LiveText() if not as_json and (live or (live is None and sys.stderr.isatty())) else None
        )
        with lost_stack(job.id):
            for event in job.events():
                if text is not None and text.take(event):
                    pass
                elif not as_json:
                    if text is not None:
                        text.end()
                    show_event(event, interactive)
                if event.type == "approval_requested" and stopped is None:
                    stopped = on_ask(job, event, policy, interactive)
                elif event.type == "input_requested" and stopped is None:
                    on_question(job, event, interactive)
            result = job.wait(timeout=timeout)
    if as_json:
        click.echo(json.dumps(result_json(result)))
    else:
        click.echo(result.final_text or result.error)
        if result.usage is not None:  # the whole tree's, with its subagents
            u = result.usage
            cost = f", ${u.cost_usd:.4f}" if u.cost_usd else ""
            console.print(f"usage: {u.turns} model turns, {u.tokens} tokens{cost}")
    if stopped:
        click.echo(stopped, err=True)
    sys.exit(0 if result.status == "completed" else 1)


@click.command()
@click.argument("job_id")
@click.argument("request_id")
@click.argument("decision", type=click.Choice(["allow-once", "allow-always", "deny"]))
@click.option("--by", default="", help="Who answers (default: this user).")
def approve(job_id: str, request_id: str, decision: str, by: str) -> None:
    """Answer a job's approval request (see its approval_requested event)."""
    with cluster() as client:
        client.job(job_id).approve(request_id, decision, by=by)
    console.print(f"{decision} sent for {request_id}")


@click.command()
@click.argument("job_id")
@click.argument("message")
def steer(job_id: str, message: str) -> None:
    """Redirect a running job: stop its current work and go on with MESSAGE."""
    with cluster() as client:
        client.job(job_id).steer(message)
    console.print(f"steered {job_id}")


@click.command()
@click.argument("job_id")
def cancel(job_id: str) -> None:
    """Cancel a job: no further model turns; it ends `cancelled`."""
    with cluster() as client:
        client.job(job_id).cancel()
    console.print(f"cancel requested for {job_id}")
