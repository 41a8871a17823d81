"""`clawq canvas open SESSION`: a session's canvas in a browser, by a short-lived signed
link (a browser sends no API key; the link names the session and when it expires)."""

from __future__ import annotations

import time
import webbrowser
from urllib.parse import quote

import click

from broker.config.settings import Settings
from broker.errors import NotFound
from broker.stores.canvas import link_key, sign_link
from orchestrator.cli.common import cluster, settings_from_env
from orchestrator.cli.common import diagnostics as console


def api_base(settings: Settings) -> str:
    """Where the API answers: the running local stack's, else the settings'."""
    from orchestrator.cli.local.state import find

    state = find()
    if state is not None and state.api_url:
        return state.api_url
    scheme = "https" if settings.api_tls_certfile else "http"
    return f"{scheme}://{settings.api_host}:{settings.api_port}"


@click.group()
def canvas() -> None:
    """A session's canvas (what its agent presents): open it in a browser."""


@canvas.command("open")
@click.argument("session_id")
@click.option("--print", "print_only", is_flag=True, help="Print the link; open no browser.")
def open_(session_id: str, print_only: bool) -> None:
    """Open SESSION's canvas page by a signed link that expires (CLAWQ_CANVAS_LINK_TTL_S);
    the link is printed on stdout too. A job's session is in its answer (session_id)."""
    settings = settings_from_env()
    with cluster() as client:
        if client.store.session_owner(session_id) is None:
            raise NotFound(f"no session {session_id}: a job's session_id names one")
        key = link_key(client.redis)
    token, expires = sign_link(key, session_id, settings.canvas_link_ttl_s, time.time())
    url = f"{api_base(settings)}/v1/sessions/{quote(session_id, safe='')}/canvas?token={token}"
    click.echo(url)
    minutes = max(1, round((expires - time.time()) / 60))
    console.print(f"the link opens the canvas for {minutes} min", markup=False)
    if not print_only:
        webbrowser.open(url)
