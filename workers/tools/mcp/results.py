"""An MCP result as text for the model: text blocks joined; images, audio and binary
resources kept as artifacts (as the media tools keep theirs) and named; resource links as
links; `structuredContent` (checked against the tool's `outputSchema` by the SDK) given as
JSON, without the text block that only repeats it; the error flag kept; output capped with
a notice; and the whole marked as untrusted (it comes from outside)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from workers.tool import ToolResult
from workers.untrusted import wrap

Keep = Callable[[bytes, str, str], Any]  # (data, mime, name) -> an Artifact


def _binary(kind: str, data: str, mime: str, name: str, keep: Keep | None) -> str:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return f"[{kind}: {mime}, not valid base64, not shown]"
    if keep is None:
        return f"[{kind}: {mime}, {len(raw)} bytes, not shown]"
    try:
        stored = keep(raw, mime, name)
    except Exception as exc:  # too big, or no store: said, never fatal
        return f"[{kind}: {mime}, {len(raw)} bytes, not kept: {exc}]"
    return f"[{kind}: {stored.describe()}]"


def _block(block: dict[str, Any], keep: Keep | None) -> str:
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind in ("image", "audio"):
        mime = str(block.get("mimeType") or "application/octet-stream")
        return _binary(kind, str(block.get("data") or ""), mime, f"mcp-{kind}", keep)
    if kind == "resource":
        resource = block.get("resource") or {}
        uri = resource.get("uri", "")
        if "text" in resource:
            return f"[resource {uri}]\n{resource['text']}"
        mime = resource.get("mimeType") or "application/octet-stream"
        name = str(uri).rstrip("/").rsplit("/", 1)[-1]
        return _binary(f"resource {uri}", str(resource.get("blob") or ""), mime, name, keep)
    if kind == "resource_link":
        mime = f" ({block['mimeType']})" if block.get("mimeType") else ""
        about = f": {block['description']}" if block.get("description") else ""
        return (
            f"[link {block.get('name', '')} <{block.get('uri', '')}>{mime}{about};"
            " read_resource reads it]"
        )
    return f"[{kind or 'unknown'} content, not shown]"


def _repeats(block: dict[str, Any], structured: Any) -> bool:
    """A text block that is only the structured content serialized (the spec's fallback)."""
    if block.get("type") != "text":
        return False
    try:
        return bool(json.loads(str(block.get("text", ""))) == structured)
    except ValueError:
        return False


def to_result(server: str, raw: dict[str, Any], cap: int, keep: Keep | None = None) -> ToolResult:
    """`raw` is the CallToolResult as JSON (`content`, `structuredContent`, `isError`)."""
    structured = raw.get("structuredContent")
    content = raw.get("content") or []
    if structured is not None:
        content = [b for b in content if not _repeats(b, structured)]
    parts = [_block(b, keep) for b in content]
    if structured is not None:
        parts.insert(0, json.dumps(structured, ensure_ascii=False))
    text = "\n".join(p for p in parts if p) or "(no output)"
    if len(text) > cap:
        text = text[:cap] + f"\n[output cut at {cap} characters of {len(text)}]"
    is_error = bool(raw.get("isError"))
    body = wrap(f"MCP server '{server}'", text)
    return ToolResult(for_llm=body, for_user=text, is_error=is_error, metadata={"server": server})
