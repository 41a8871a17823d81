"""Managing custom tools (CLI and API): define, list, show, disable, remove.

Every check happens here, before anything is stored: the definition itself
(`broker.stores.custom_tools.CustomToolSpec`), its template (every placeholder a whole word
that is data, never code: `workers.tools.custom_tools.template`), a name that no native or
MCP tool has, a timeout within the setting, secrets only with a key to seal them. A stored
tool whose template breaks the rule is listed and shown with its `problem`. Every change
is announced
(topic `custom_tools`), which the next job of every orchestrator and every call on every
worker sees.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from broker.config.secretbox import SecretBox, SecretError
from broker.config.settings import Settings
from broker.errors import Invalid, NotFound
from broker.pg.store import Store
from broker.stores.custom_tools import CustomTool, CustomToolSpec, CustomToolStore
from broker.stores.mcp import McpStore
from orchestrator.admin.definitions import read_definition


class CustomAdminError(Invalid):
    """A definition refused; the message (and `field`) say what to change."""


def spec_from(config: dict[str, Any] | str | Path) -> CustomToolSpec:
    """A definition from a dict, a JSON string or a file; every problem named at once."""
    config = read_definition(config)
    try:
        return CustomToolSpec.model_validate(config)
    except ValidationError as exc:
        problems, fields = [], []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            message = err["msg"].removeprefix("Value error, ")
            problems.append(f"{where}: {message}" if where else message)
            fields.append(where)
        raise CustomAdminError("; ".join(problems), field=fields[0] or None) from None


class CustomAdmin:
    def __init__(
        self, store: Store, settings: Settings, notify: Callable[[], object] = lambda: None
    ) -> None:
        self.store = store
        self.tools = CustomToolStore(store)
        self.settings = settings
        self.notify = notify

    def put(self, config: dict[str, Any] | str | Path | CustomToolSpec) -> CustomTool:
        spec = config if isinstance(config, CustomToolSpec) else spec_from(config)
        from workers.registry import default_registry
        from workers.tools.custom_tools.template import TemplateError, check

        try:
            check(spec.command, spec.parameters)
        except TemplateError as exc:
            raise CustomAdminError(f"command: {exc}", field="command") from None

        if spec.name in default_registry():
            raise CustomAdminError(f"name: {spec.name} is a native tool's name", field="name")
        if spec.name.startswith("mcp_") or spec.name in {
            t.exposed_name for t in McpStore(self.store).catalog()
        }:
            raise CustomAdminError(
                f"name: {spec.name} is an MCP tool's name (mcp_ is theirs)", field="name"
            )
        if spec.timeout_seconds > self.settings.custom_tool_max_timeout_s:
            raise CustomAdminError(
                f"timeout_seconds: at most {self.settings.custom_tool_max_timeout_s} "
                "(CLAWQ_CUSTOM_TOOL_MAX_TIMEOUT_S)",
                field="timeout_seconds",
            )
        try:
            stored = self.tools.put(spec, SecretBox.from_settings(self.settings))
        except SecretError as exc:
            raise CustomAdminError(f"env: {exc}", field="env") from None
        self.notify()
        return stored

    def list(self) -> list[CustomTool]:
        return [_checked(t) for t in self.tools.all()]

    def show(self, name: str, agent_id: str = "") -> CustomTool:
        found = self.tools.get(name, agent_id)
        if found is None:
            of = f" of agent {agent_id}" if agent_id else ""
            raise NotFound(f"no custom tool '{name}'{of}")
        return _checked(found)

    def enable(self, name: str, agent_id: str = "", enabled: bool = True) -> None:
        if not self.tools.set_enabled(name, agent_id, enabled):
            raise NotFound(f"no custom tool '{name}'")
        self.notify()

    def remove(self, name: str, agent_id: str = "") -> None:
        if not self.tools.remove(name, agent_id):
            raise NotFound(f"no custom tool '{name}'")
        self.notify()


def _checked(tool: CustomTool) -> CustomTool:
    """The stored tool with why it cannot run, if its template breaks the rule."""
    from workers.tools.custom_tools.tool import template_of

    return tool.model_copy(update={"problem": template_of(tool)[1]})
