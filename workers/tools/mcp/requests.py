"""The request behind a catalog entry: `tools/call` for a server's tool, or the built-ins
(`resources/list`, `resources/read`, `prompts/list`, `prompts/get`). Every answer comes
back in the shape of a `CallToolResult` (content blocks, structured content, the error
flag), so one path (`results.py`) makes text and artifacts of all of them."""

from __future__ import annotations

import json
from typing import Any

from workers.tools.mcp.calls import McpError, Progress
from workers.tools.mcp.resources import ResourceCache


def _dump(model: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


def _text(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


async def send(
    client: Any,
    tool: str,
    arguments: dict[str, Any],
    progress: Progress,
    resources: ResourceCache | None = None,
) -> Any:
    if tool == "resources/list":
        return await list_resources(client, arguments.get("cursor"))
    if tool == "resources/read":
        uri = str(arguments.get("uri") or "")
        if not uri:
            raise McpError("read_resource needs a uri")
        return await (resources or ResourceCache()).read(client, uri)
    if tool == "prompts/list":
        page = await client.list_prompts(cursor=arguments.get("cursor"), cache_mode="bypass")
        lines = []
        for p in page.prompts:
            names = ", ".join(a.name + ("" if a.required else "?") for a in p.arguments or [])
            lines.append(f"- {p.name}({names})" + (f": {p.description}" if p.description else ""))
        if page.next_cursor:
            lines.append(f"(more: cursor {page.next_cursor})")
        return _text("\n".join(lines) or "(no prompts)")
    if tool == "prompts/get":
        got = await client.get_prompt(
            str(arguments.get("name") or ""),
            {str(k): str(v) for k, v in (arguments.get("arguments") or {}).items()},
        )
        blocks = []
        if got.description:
            blocks.append({"type": "text", "text": got.description})
        for message in got.messages:
            blocks.append({"type": "text", "text": f"[{message.role}]"})
            blocks.append(_dump(message.content))
        return {"content": blocks, "isError": False}
    result = await client.call_tool(tool, arguments, progress_callback=progress)
    return result.model_dump(mode="json", by_alias=True)


async def list_resources(client: Any, cursor: str | None) -> dict[str, Any]:
    """A page of resources, and (on the first page) the templates that name more."""
    page = await client.list_resources(cursor=cursor, cache_mode="bypass")
    lines = ["resources:"] if page.resources else []
    for r in page.resources:
        mime = f" ({r.mime_type})" if r.mime_type else ""
        about = f": {r.description}" if r.description else ""
        lines.append(f"- {r.uri} {r.name}{mime}{about}")
    if page.next_cursor:
        lines.append(f"(more: cursor {json.dumps(page.next_cursor)})")
    if cursor is None:
        templates = await client.list_resource_templates(cache_mode="bypass")
        if templates.resource_templates:
            lines.append("resource templates (fill in the {placeholders}, then read_resource):")
        for t in templates.resource_templates:
            about = f": {t.description}" if t.description else ""
            lines.append(f"- {t.uri_template} {t.name}{about}")
    return _text("\n".join(lines) or "(no resources)")
