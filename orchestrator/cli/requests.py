"""`clawq requests`: the pending approvals and questions across jobs (a person's inbox),
and `clawq answer JOB REQUEST "…"`: a question's answer (ask_user)."""

from __future__ import annotations

import json
import time
import webbrowser
from urllib.parse import urlencode

import click

from broker.stores.canvas import link_key, sign_link
from orchestrator.cli.canvas import api_base
from orchestrator.cli.common import cluster, json_option, settings_from_env, table
from orchestrator.cli.common import diagnostics as console


@click.command("requests")
@click.option("--user", default=None, help="Only this user's (default: everyone's).")
@json_option
@click.option("--link", is_flag=True, help="Print a signed link to the inbox page instead.")
@click.option("--open", "open_", is_flag=True, help="Open the inbox page in a browser.")
def requests_(user: str | None, as_json: bool, link: bool, open_: bool) -> None:
    """Pending approvals and questions, oldest first; answer them with `clawq approve` and
    `clawq answer`, or on the inbox page (--link, --open)."""
    with cluster() as client:
        if link or open_:
            settings = settings_from_env()
            who, admin = (user, False) if user else ("operator", True)
            subject = f"inbox:{'admin' if admin else 'user'}:{who}"
            key = link_key(client.redis)
            token, _ = sign_link(key, subject, settings.canvas_link_ttl_s, time.time())
            query = urlencode({"user": who, "admin": int(admin), "token": token})
            url = f"{api_base(settings)}/v1/inbox?{query}"
            click.echo(url)
            if open_:
                webbrowser.open(url)
            return
        found = client.requests(user)
    rows = [
        (
            r.job_id,
            r.id,
            r.kind,
            r.question.question if r.question else f"{r.tool} {json.dumps(r.input)[:80]}",
            f"{r.requested_at:%Y-%m-%d %H:%M:%S}",
            r.user_id,
        )
        for r in found
    ]
    records = [r.model_dump(mode="json") for r in found]
    table(["job", "request", "kind", "what", "asked", "user"], rows, records, as_json)
    if not found and not as_json:
        console.print("no pending requests")


@click.command()
@click.argument("job_id")
@click.argument("request_id")
@click.argument("answer", nargs=-1)
@click.option("--by", default="", help="Who answers (default: this user).")
@click.option("--decline", is_flag=True, help="Refuse an MCP server's request (elicitation).")
def answer(job_id: str, request_id: str, answer: tuple[str, ...], by: str, decline: bool) -> None:
    """Answer a job's question (its input_requested event): text, or one of its choices
    (several, each its own argument, when it allows several). An MCP server's request
    (kind elicitation) takes a JSON object or name=value arguments (`date=2025-05-01
    guests=2`), checked against the server's schema; or --decline."""
    if bool(answer) == decline:
        raise click.UsageError("give an answer, or --decline (not both)")
    with cluster() as client:
        given: str | list[str] = answer[0] if len(answer) == 1 else list(answer)
        job = client.job(job_id)
        job.answer(request_id, None if decline else given, by=by, decline=decline)
    console.print(f"{'declined' if decline else 'answer sent for'} {request_id}")
