"""The tools' reference, made from their declarations (the pydantic input models, through the
JSON schema the models are shown): `clawq tools schema [NAME]` prints it, and
docs/tools.md is this module's Markdown, kept in sync by a test."""

from __future__ import annotations

import json
from typing import Any

from workers.registry import Registry
from workers.tool import Tool

HEADER = """# Tools

Every native tool, its queue, its default permission and its input, generated from the
tool declarations (the pydantic models whose JSON schema the model is shown). Do not edit:
`clawq tools schema --markdown > docs/tools.md` writes it, and a test (tests/workers/
test_reference.py) fails when it is out of date. MCP tools and custom tools are described
by their own schemas (`clawq mcp tools --json`, `clawq tools show NAME`).
"""


def entry(registry: Registry, tool: Tool[Any]) -> dict[str, Any]:
    return {
        "name": tool.name,
        "group": tool.group.value,
        "description": tool.description,
        "permission": tool.default_permission,
        "side_effect": tool.side_effect.value,
        "timeout_s": tool.timeout_s,
        "input_schema": registry.schema(tool),
    }


def _kind(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    """A property's type in words: `"a" | "b"`, `integer ≥ 60`, `array of string`, …"""
    if "enum" in prop:
        return " \\| ".join(json.dumps(v) for v in prop["enum"])
    if "const" in prop:
        return json.dumps(prop["const"])
    if "$ref" in prop:
        return f"object ({prop['$ref'].rsplit('/', 1)[-1]})"
    if "anyOf" in prop:
        kinds = [_kind(p, defs) for p in prop["anyOf"] if p.get("type") != "null"]
        nullable = any(p.get("type") == "null" for p in prop["anyOf"])
        return " \\| ".join(kinds) + (" \\| null" if nullable and not kinds else "")
    kind = str(prop.get("type", "any"))
    if kind == "array" and "items" in prop:
        kind = f"array of {_kind(prop['items'], defs)}"
    if kind == "object" and isinstance(prop.get("additionalProperties"), dict):
        kind = f"object of {_kind(prop['additionalProperties'], defs)}"
    bounds = {
        "minimum": "≥",
        "exclusiveMinimum": ">",
        "maximum": "≤",
        "exclusiveMaximum": "<",
        "minLength": "length ≥",
        "maxLength": "length ≤",
        "minItems": "items ≥",
        "maxItems": "items ≤",
    }
    limits = [f"{word} {prop[key]}" for key, word in bounds.items() if key in prop]
    if "format" in prop:
        limits.append(str(prop["format"]))
    return kind + (f" ({', '.join(limits)})" if limits else "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _fields(schema: dict[str, Any]) -> list[str]:
    props: dict[str, Any] = schema.get("properties", {})
    if not props:
        return ["No input."]
    required = set(schema.get("required", []))
    defs = schema.get("$defs", {})
    lines = ["| field | type | required | default | description |", "|---|---|---|---|---|"]
    for name, prop in props.items():
        default = json.dumps(prop["default"]) if "default" in prop else ""
        lines.append(
            f"| `{name}` | {_kind(prop, defs)} | {'yes' if name in required else ''}"
            f" | {_cell(default)} | {_cell(prop.get('description', ''))} |"
        )
    return lines


def markdown(registry: Registry) -> str:
    tools = [registry.get(name) for name in registry.names()]
    found = [t for t in tools if t is not None]
    lines = [HEADER, "| tool | queue | permission | effect |", "|---|---|---|---|"]
    lines += [
        f"| [`{t.name}`](#{t.name}) | {t.group.value} | {t.default_permission}"
        f" | {t.side_effect.value} |"
        for t in found
    ]
    for tool in found:
        lines += ["", f"## {tool.name}", "", _cell(tool.description), ""]
        lines += _fields(registry.schema(tool))
    return "\n".join(lines) + "\n"
