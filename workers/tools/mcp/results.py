"""An MCP tool result as text for the model: text blocks joined, images, audio and binary
resources as placeholders, structured content when there is no text, the error flag kept,
output capped with a notice, and the whole marked as untrusted (it comes from outside)."""

from __future__ import annotations

import json
from typing import Any

from workers.tool import ToolResult
from workers.untrusted import wrap


def _block(block: dict[str, Any]) -> str:
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind in ("image", "audio"):
        size = len(block.get("data") or "") * 3 // 4
        return f"[{kind}: {block.get('mimeType', 'unknown type')}, {size} bytes, not shown]"
    if kind == "resource":
        resource = block.get("resource") or {}
        uri = resource.get("uri", "")
        if "text" in resource:
            return f"[resource {uri}]\n{resource['text']}"
        mime = resource.get("mimeType", "binary")
        return f"[resource {uri}: {mime}, not shown]"
    if kind == "resource_link":
        return f"[resource link {block.get('uri', '')}: {block.get('name', '')}]"
    return f"[{kind or 'unknown'} content, not shown]"


def to_result(server: str, raw: dict[str, Any], cap: int) -> ToolResult:
    """`raw` is the CallToolResult as JSON (`content`, `structuredContent`, `isError`)."""
    blocks = [_block(b) for b in raw.get("content") or []]
    text = "\n".join(b for b in blocks if b)
    structured = raw.get("structuredContent")
    if not any(b.get("type") == "text" for b in raw.get("content") or []) and structured:
        text = json.dumps(structured, ensure_ascii=False, indent=1)
    if not text:
        text = "(no output)"
    if len(text) > cap:
        text = text[:cap] + f"\n[output cut at {cap} characters of {len(text)}]"
    is_error = bool(raw.get("isError"))
    body = wrap(f"MCP server '{server}'", text)
    return ToolResult(for_llm=body, for_user=text, is_error=is_error, metadata={"server": server})
