"""`clawq mcp …`: servers, the tool catalog, grants and access requests."""

from __future__ import annotations

import getpass
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

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
    """The configured servers and how their connections fare (why one has no tools); no
    secrets: headers and env are not shown."""
    with admin() as a:
        servers, states = a.servers(), a.states()
    rows = []
    for s in servers:
        state = states.get(s.name)
        rows.append(
            (
                s.name,
                s.transport,
                " ".join([s.command, *s.args]) if s.transport == "stdio" else s.url,
                s.enabled,
                (state.state if state else "") or "not tried yet (is an mcp worker up?)",
                state.last_error if state else "",
            )
        )
    columns = ("name", "transport", "target", "enabled", "state", "error")
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
