"""The registry: declared tools by name, validation of calls, provider tool definitions."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import BaseModel, ValidationError

from broker.errors import ConfigurationError
from broker.protocol import Group
from workers.tool import Tool, ToolInput, ToolResult

NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class DeclarationError(ConfigurationError):
    """A tool declaration is wrong; every problem found is listed at once."""


def _problems(tool: type[Tool[Any]]) -> list[str]:
    found = []
    name = getattr(tool, "name", None)
    label = name or tool.__name__
    if not isinstance(name, str) or not NAME_RE.match(name):
        found.append(f"{label}: name must match {NAME_RE.pattern}")
    if not getattr(tool, "description", "").strip():
        found.append(f"{label}: description is empty")
    if not isinstance(getattr(tool, "group", None), Group):
        found.append(f"{label}: group must be one of {[g.value for g in Group]}")
    model = getattr(tool, "input_model", None)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        found.append(f"{label}: input_model must be a pydantic model")
    if tool.default_permission not in ("allow", "ask", "deny"):
        found.append(f"{label}: default_permission must be allow, ask or deny")
    if tool.timeout_s <= 0:
        found.append(f"{label}: timeout_s must be positive")
    return found


def _error_summary(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "input"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


class Registry:
    """Tools by name. Built once per process; read-only afterwards."""

    def __init__(self, tools: Iterable[type[Tool[Any]]] = ()) -> None:
        self._tools: dict[str, Tool[Any]] = {}
        self._schemas: dict[str, dict[str, Any]] = {}
        self._descriptions: dict[tuple[str, tuple[str, ...]], list[dict[str, Any]]] = {}
        self._description_chars: dict[tuple[str, ...], int] = {}
        self.register(*tools)

    def register(self, *tools: type[Tool[Any]]) -> None:
        problems = [p for tool in tools for p in _problems(tool)]
        names = [t.name for t in tools] + list(self._tools)
        problems += [
            f"{n}: registered twice" for n in sorted({n for n in names if names.count(n) > 1})
        ]
        if problems:
            raise DeclarationError("invalid tool declarations:\n  " + "\n  ".join(problems))
        for tool in tools:
            self._tools[tool.name] = tool()
        self._descriptions.clear()

    def __iter__(self) -> Iterator[Tool[Any]]:
        return iter(self._tools.values())

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def get(self, name: str) -> Tool[Any] | None:
        return self._tools.get(name)

    def declared(self, name: str) -> Tool[Any] | None:
        """A tool declared in this process (never a lookup elsewhere, as `get` may make)."""
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def groups(self) -> list[Group]:
        return sorted({tool.group for tool in self}, key=list(Group).index)

    def resolve(self, name: str, agent_id: str) -> Tool[Any] | None:
        """A tool not declared here but known elsewhere (a custom tool of the agent)."""
        return None

    def parse(
        self, name: str, raw: Any, agent_id: str = ""
    ) -> tuple[Tool[Any], ToolInput] | ToolResult:
        """The tool and its validated input, or an error result; no tool code runs here."""
        tool = self.get(name) or self.resolve(name, agent_id)
        if tool is None:
            return ToolResult.error(
                f"Unknown tool '{name}'. Available tools: {', '.join(self.names())}."
            )
        try:
            return tool, tool.input_model.model_validate(raw)
        except ValidationError as exc:
            return ToolResult.error(f"Invalid input for {name}: {_error_summary(exc)}")

    def openai_tools(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """The tools as OpenAI's API describes them (made once per selection: every job
        of an agent asks for the same list; callers must not change it)."""
        return self._described("openai", names)

    def anthropic_tools(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """The tools as Anthropic's API describes them (made once per selection)."""
        return self._described("anthropic", names)

    def described_chars(self, names: Iterable[str] | None = None) -> int:
        """The characters of `openai_tools(names)` as JSON, the tools' share of a request's
        size (measured once per selection, not once per job)."""
        key = tuple(t.name for t in self._select(names))
        if (found := self._description_chars.get(key)) is None:
            found = self._description_chars[key] = len(json.dumps(self.openai_tools(names)))
        return found

    def _described(self, api: str, names: Iterable[str] | None) -> list[dict[str, Any]]:
        tools = self._select(names)
        key = (api, tuple(t.name for t in tools))
        if (found := self._descriptions.get(key)) is None:
            found = self._descriptions[key] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": self._schema(t),
                    },
                }
                if api == "openai"
                else {"name": t.name, "description": t.description, "input_schema": self._schema(t)}
                for t in tools
            ]
        return found

    def schema(self, tool: Tool[Any]) -> dict[str, Any]:
        """The JSON schema of the tool's input, as the model is shown it."""
        return self._schema(tool)

    def _schema(self, tool: Tool[Any]) -> dict[str, Any]:
        """The input model's JSON schema, generated once (it costs ~1 ms a tool)."""
        if tool.input_schema is not None:
            return tool.input_schema
        if tool.name not in self._schemas:
            self._schemas[tool.name] = tool.input_model.model_json_schema()
        return self._schemas[tool.name]

    def extended(self, tools: Iterable[type[Tool[Any]]]) -> Registry:
        """This registry plus `tools` (a job's MCP tools), sharing the schema cache."""
        copy = Registry()
        copy._tools = dict(self._tools)
        copy._schemas = self._schemas
        copy.register(*tools)
        return copy

    def _select(self, names: Iterable[str] | None) -> list[Tool[Any]]:
        chosen = self.names() if names is None else sorted(set(names) & set(self._tools))
        return [self._tools[n] for n in chosen]


def default_registry() -> Registry:
    """Every native tool; declarations are cheap to import (implementations import lazily)."""
    from workers.tools import automation, fs, media, memory, messaging, runtime, sessions, ui, web

    return Registry(
        [
            *fs.TOOLS,
            *runtime.TOOLS,
            *sessions.TOOLS,
            *web.TOOLS,
            *memory.TOOLS,
            *ui.TOOLS,
            *automation.TOOLS,
            *messaging.TOOLS,
            *media.TOOLS,
        ]
    )
