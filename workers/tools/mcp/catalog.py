"""What a server offers, as the catalog stores it: its tools, the built-in tools that reach
its resources and prompts (when it has them), and the facts `clawq mcp list` shows (the
negotiated protocol version, its prompts and resource templates).

The built-ins are catalog entries named by their MCP method (`resources/list`, ...): no
server tool can be named so (a tool name has no `/`), and `exposed_name` shows them as
`mcp_<server>__list_resources`; they are granted like any other tool of the server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from broker.config.mcp import BUILTINS

Row = tuple[str, str, dict[str, Any]]
TEMPLATES = "resource_templates"
PROMPTS, PROMPT_CHARS = 20, 20_000  # prompts rendered at listing, and how much of each
CURSOR = {"cursor": {"type": "string", "description": "from the last page, for the next"}}
BUILTIN_SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "resources/list": (
        "List the resources and resource templates of MCP server '{server}'.",
        {"type": "object", "properties": CURSOR},
    ),
    "resources/read": (
        "Read a resource of MCP server '{server}' by its URI (listed, linked, or a template"
        " filled in).",
        {
            "type": "object",
            "properties": {"uri": {"type": "string", "description": "the resource's URI"}},
            "required": ["uri"],
        },
    ),
    "prompts/list": (
        "List the prompts of MCP server '{server}' and their arguments.",
        {"type": "object", "properties": CURSOR},
    ),
    "prompts/get": (
        "Get a prompt of MCP server '{server}', filled in with its arguments.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "arguments": {"type": "object", "additionalProperties": {"type": "string"}},
            },
            "required": ["name"],
        },
    ),
}
assert set(BUILTIN_SCHEMAS) == set(BUILTINS)


async def pages(fetch: Callable[[str | None], Awaitable[Any]], field: str) -> AsyncIterator[Any]:
    """Every item of a paginated list, page after page."""
    cursor = None
    while True:
        page = await fetch(cursor)
        for item in getattr(page, field):
            yield item
        cursor = page.next_cursor
        if cursor is None:
            return


async def _rendered(client: Any, name: str) -> str:
    """A prompt that needs no arguments, as text (for `--mcp-prompt`): its messages' text."""
    from mcp import MCPError

    try:
        got = await client.get_prompt(name)
    except MCPError:
        return ""
    parts = [m.content.text for m in got.messages if getattr(m.content, "type", "") == "text"]
    return "\n\n".join(parts)[:PROMPT_CHARS]


async def _answers(method: Callable[..., Awaitable[Any]]) -> bool:
    """Whether a server that claims a capability answers its list (some refuse it)."""
    from mcp import MCPError

    try:
        await method(cache_mode="bypass")
    except MCPError:
        return False
    return True


async def listing(client: Any, server: str) -> tuple[list[Row], dict[str, Any]]:
    """The server's catalog rows and its facts, read from a connected SDK client."""
    caps = client.server_capabilities
    rows: list[Row] = []
    async for tool in pages(lambda c: client.list_tools(cursor=c, cache_mode="bypass"), "tools"):
        rows.append((tool.name, tool.description or "", dict(tool.input_schema)))
    facts: dict[str, Any] = {
        "protocol_version": client.protocol_version,
        "server": (client.server_info.name if client.server_info else ""),
        "capabilities": sorted(set(caps.model_dump(exclude_none=True)) - {"experimental"}),
        "prompts": [],
        "resource_templates": [],
    }
    kinds = []  # the built-ins of what the server has: capabilities alone are often empty
    if caps.resources is not None and await _answers(client.list_resources):
        first = await client.list_resources(cache_mode="bypass")
        templates = client.list_resource_templates
        async for t in pages(lambda c: templates(cursor=c, cache_mode="bypass"), TEMPLATES):
            about = t.description or ""
            facts["resource_templates"].append(
                {"uri_template": t.uri_template, "name": t.name, "description": about}
            )
        if first.resources or facts["resource_templates"]:
            kinds += ["resources/list", "resources/read"]
    if caps.prompts is not None and await _answers(client.list_prompts):
        prompts = client.list_prompts
        async for p in pages(lambda c: prompts(cursor=c, cache_mode="bypass"), "prompts"):
            arguments = [
                {"name": a.name, "required": bool(a.required), "description": a.description or ""}
                for a in p.arguments or []
            ]
            facts["prompts"].append(
                {"name": p.name, "description": p.description or "", "arguments": arguments}
            )
            if not any(a["required"] for a in arguments) and len(facts["prompts"]) <= PROMPTS:
                facts["prompts"][-1]["text"] = await _rendered(client, p.name)
        if facts["prompts"]:
            kinds += ["prompts/list", "prompts/get"]
    for kind in kinds:
        description, schema = BUILTIN_SCHEMAS[kind]
        rows.append((kind, description.format(server=server), schema))
    return rows, facts
