"""`clawq tools …`: custom tools (admin), defined from JSON at run time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import click

from orchestrator.admin.custom_tools import CustomAdmin
from orchestrator.cli.common import cluster, json_option, table


@contextmanager
def admin() -> Iterator[CustomAdmin]:
    with cluster() as client:
        yield client.custom_tools


agent_option = click.option("--agent", default="", help="The agent's own tool (default: global).")


@click.group()
def tools() -> None:
    """Custom tools: shell templates defined at run time (goclaw §8)."""


@tools.command("add")
@click.argument("definition")
def add(definition: str) -> None:
    """Define or replace a tool from JSON: a file, or the JSON itself."""
    with admin() as a:
        tool = a.put(definition)
    click.echo(f"defined {tool.name} (version {tool.version})")


@tools.command("list")
@json_option
def list_tools(as_json: bool) -> None:
    """Every custom tool (env secrets are never shown: only their names); a tool whose
    template breaks the rule (stored before templates were checked) says why it is refused."""
    with admin() as a:
        found = a.list()
    rows = [
        (
            t.name,
            t.agent_id or "(global)",
            f"refused: {t.problem}" if t.problem else t.enabled,
            t.timeout_seconds,
            t.env_names,
            t.command,
        )
        for t in found
    ]
    records = [t.model_dump(mode="json") for t in found]
    table(("name", "agent", "enabled", "timeout s", "env", "command"), rows, records, as_json)


@tools.command("show")
@click.argument("name")
@agent_option
def show(name: str, agent: str) -> None:
    """One tool's definition as JSON (without secrets)."""
    with admin() as a:
        click.echo(a.show(name, agent).model_dump_json(indent=2))


def _switch(enabled: bool, doc: str) -> click.Command:
    verb = "enable" if enabled else "disable"

    @tools.command(verb, help=doc)
    @click.argument("name")
    @agent_option
    def switch(name: str, agent: str) -> None:
        with admin() as a:
            a.enable(name, agent, enabled)
        click.echo(f"{verb}d {name}")

    return switch


disable = _switch(False, "Stop offering a tool (the next job no longer sees it).")
enable = _switch(True, "Offer a disabled tool again.")


@tools.command("remove")
@click.argument("name")
@agent_option
def remove(name: str, agent: str) -> None:
    """Delete a tool and its sealed secrets."""
    with admin() as a:
        a.remove(name, agent)
    click.echo(f"removed {name}")


@tools.command("schema")
@click.argument("name", required=False)
@click.option("--markdown", is_flag=True, help="The reference as Markdown (docs/tools.md).")
def schema(name: str | None, markdown: bool) -> None:
    """The native tools' inputs and descriptions, from their declarations: every tool, or
    NAME's (JSON; --markdown for the reference in docs/tools.md)."""
    from workers import reference
    from workers.registry import default_registry

    registry = default_registry()
    if markdown:
        click.echo(reference.markdown(registry), nl=False)
        return
    if name is None:
        found = [reference.entry(registry, t) for t in registry]
        click.echo(json.dumps(found, indent=2))
        return
    tool = registry.get(name)
    if tool is None:
        raise click.UsageError(f"no native tool {name}; tools: {', '.join(registry.names())}")
    click.echo(json.dumps(reference.entry(registry, tool), indent=2))
