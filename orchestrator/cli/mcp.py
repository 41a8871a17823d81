"""`clawq mcp …`: servers, the tool catalog, grants, access requests, and a person's OAuth
login to a server."""

from __future__ import annotations

import getpass
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlparse

import click

from orchestrator.admin.mcp import McpAdmin
from orchestrator.cli.common import cluster, json_option, table


@contextmanager
def admin() -> Iterator[McpAdmin]:
    with cluster() as client:
        yield client.mcp


F = TypeVar("F", bound=Callable[..., Any])


def with_subject(f: F) -> F:
    """--agent or --user: whom a grant or a request is for."""
    f = click.option("--user", default=None, help="A user id.")(f)
    return click.option("--agent", default=None, help="An agent id.")(f)


@click.group()
def mcp() -> None:
    """MCP servers, their tools, grants and access requests."""


@mcp.command("add")
@click.argument("config")
def add(config: str) -> None:
    """Add or replace servers from `mcpServers` JSON: a file or the JSON itself."""
    with admin() as a:
        names = a.add(config)
    click.echo("added " + ", ".join(names))


@mcp.command("list")
@json_option
def list_servers(as_json: bool) -> None:
    """The configured servers (no secrets: headers and env are not shown), how their
    connections fare (why one has no tools), the protocol version the workers negotiated
    with each, and where its OAuth grant stands."""
    with admin() as a:
        found = a.status()
    rows = [
        (
            s.name,
            s.transport,
            s.target,
            s.enabled,
            s.state or "not tried yet (is an mcp worker up?)",
            s.last_error,
            s.protocol_version,
            s.auth,
        )
        for s in found
    ]
    columns = ("name", "transport", "target", "enabled", "state", "error", "protocol", "auth")
    table(columns, rows, as_json=as_json)


@mcp.command("remove")
@click.argument("name")
def remove(name: str) -> None:
    """Remove a server, its tools and its grants."""
    with admin() as a:
        a.remove(name)
    click.echo(f"removed {name}")


@mcp.command("tools")
@json_option
def tools(as_json: bool) -> None:
    """The catalog: tools the mcp workers listed, by exposed name."""
    with admin() as a:
        found = a.tools()
    rows = [(t.exposed_name, t.server, t.tool, t.description.split("\n", 1)[0]) for t in found]
    records = [t.model_dump(mode="json") for t in found]
    table(("exposed name", "server", "tool", "description"), rows, records, as_json)


@mcp.command("grant")
@click.argument("server")
@with_subject
@click.option("--allow", multiple=True, help="A tool it may use (none given: every tool).")
@click.option("--deny", multiple=True, help="A tool it may not use (deny wins).")
def grant(
    server: str, agent: str | None, user: str | None, allow: tuple[str, ...], deny: tuple[str, ...]
) -> None:
    """Grant an agent or a user a server's tools."""
    with admin() as a:
        a.grant(
            server, agent=agent, user=user, allow=list(allow), deny=list(deny), by=getpass.getuser()
        )
    click.echo(f"granted {server} to {'agent ' + agent if agent else 'user ' + str(user)}")


@mcp.command("revoke")
@click.argument("server")
@with_subject
def revoke(server: str, agent: str | None, user: str | None) -> None:
    """Take a grant back."""
    with admin() as a:
        a.revoke(server, agent=agent, user=user)
    click.echo(f"revoked {server}")


@mcp.command("grants")
@json_option
def grants(as_json: bool) -> None:
    """Every grant."""
    with admin() as a:
        found = a.grants()
    rows = [
        (g.server, g.scope, g.subject, ",".join(g.tool_allow) or "*", g.tool_deny, g.enabled)
        for g in found
    ]
    records = [g.model_dump(mode="json") for g in found]
    table(("server", "scope", "subject", "allow", "deny", "enabled"), rows, records, as_json)


@mcp.command("request")
@click.argument("server")
@with_subject
@click.option("--allow", multiple=True, help="A tool asked for (none given: every tool).")
@click.option("--reason", default="", help="Why.")
def request(
    server: str, agent: str | None, user: str | None, allow: tuple[str, ...], reason: str
) -> None:
    """Ask for access to a server; an admin reviews it."""
    with admin() as a:
        request_id = a.request(
            server, agent=agent, user=user, allow=list(allow), reason=reason, by=getpass.getuser()
        )
    click.echo(request_id)


@mcp.command("requests")
@click.option("--all", "everything", is_flag=True, help="Reviewed ones too.")
@json_option
def requests(everything: bool, as_json: bool) -> None:
    """Access requests waiting for review."""
    with admin() as a:
        found = a.requests(None if everything else "pending")
    rows = [
        (r.id, r.server, r.scope, r.subject, ",".join(r.tool_allow) or "*", r.status, r.reason)
        for r in found
    ]
    records = [r.model_dump(mode="json") for r in found]
    table(("id", "server", "scope", "subject", "allow", "status", "reason"), rows, records, as_json)


@mcp.command("review")
@click.argument("request_id")
@click.argument("decision", type=click.Choice(["approve", "reject"]))
def review(request_id: str, decision: str) -> None:
    """Approve (the grant is created at once) or reject an access request."""
    with admin() as a:
        done = a.review(request_id, decision == "approve", by=getpass.getuser())
    click.echo(f"{done.status} {done.id}")


class Catcher:
    """The redirect's end on a loopback port: takes one `/callback`, keeps its query."""

    def __init__(self, port: int) -> None:
        caught: dict[str, str] = {}
        done = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlparse(self.path).query)
                if not urlparse(self.path).path.endswith("/callback") or done.is_set():
                    self.send_error(404)
                    return
                caught.update({k: v[0] for k, v in query.items()})
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.end_headers()
                self.wfile.write(b"clawq has the code: you may close this tab.\n")
                done.set()

            def log_message(self, *args: Any) -> None:  # the code is not for the terminal
                pass

        self.http = HTTPServer(("127.0.0.1", port), Handler)
        self.port = self.http.server_address[1]
        self.caught, self.done = caught, done
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def wait(self, timeout_s: float) -> dict[str, str]:
        try:
            if not self.done.wait(timeout_s):
                raise click.ClickException(f"no answer from the browser in {timeout_s:g} s")
            return self.caught
        finally:
            self.http.shutdown()
            self.http.server_close()


def _answer(pasted: str, state: str) -> dict[str, str]:
    """What the person pasted: the address the browser ended on, or the code alone."""
    pasted = pasted.strip()
    if "code=" in pasted or "error=" in pasted:
        return {k: v[0] for k, v in parse_qs(urlparse(pasted).query or pasted).items()}
    return {"code": pasted, "state": state}


@mcp.command("login")
@click.argument("server")
@click.option("--port", default=0, help="The loopback port the browser is sent back to.")
@click.option(
    "--paste",
    is_flag=True,
    help="Do not listen: paste the address the browser ended on (a browser on another host).",
)
@click.option("--timeout", default=300.0, help="How long to wait for the browser, in seconds.")
def login(server: str, port: int, paste: bool, timeout: float) -> None:
    """Log in to a server that uses OAuth (authorization code with PKCE): open the URL
    printed; the code comes back to a loopback port (or is pasted). The tokens are kept
    sealed, for every mcp worker."""
    catcher = None if paste else Catcher(port)
    redirect = f"http://127.0.0.1:{catcher.port if catcher else port or 33418}/callback"
    with admin() as a:
        start = a.login_start(server, redirect)
        click.echo("Open this address in a browser and log in:")
        click.echo(start.url)
        if catcher is not None:
            answer = catcher.wait(timeout)
        else:
            answer = _answer(click.prompt("The address the browser ended on (or the code)"), "")
            answer.setdefault("state", start.state)
        if "error" in answer:
            said = answer.get("error_description") or answer["error"]
            raise click.ClickException(f"the authorization server said no: {said}")
        if answer.get("state") != start.state:
            raise click.ClickException("the answer is for another login: start again")
        name = a.login_finish(answer["state"], answer.get("code", ""))
    click.echo(f"logged in to {name}")
