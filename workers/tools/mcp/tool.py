"""Group mcp: the tools of MCP servers, one declaration per catalog entry.

A declaration is made from the catalog row (exposed name, server, tool, description, JSON
schema) without importing `mcp`; the call runs on an `mcp` worker, which holds the server
sessions (`workers/tools/mcp/client.py`) and checks the grants again before calling.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from pydantic import ConfigDict

from broker.config.mcp import granted
from broker.config.settings import Settings
from broker.pg.store import Store
from broker.protocol import Group
from broker.stores.mcp import McpStore, McpToolRow
from workers.registry import Registry
from workers.tool import SideEffect, Tool, ToolContext, ToolError, ToolInput, ToolResult

MCP_TASK = "clawq.tool.mcp"


class McpInput(ToolInput):
    """Whatever the server's schema asks for: the server validates it."""

    model_config = ConfigDict(extra="allow")


class McpTool(Tool[McpInput]):
    group = Group.mcp
    input_model = McpInput
    side_effect = SideEffect.write
    default_permission = "allow"  # a grant is the access decision; rules may still ask or deny
    task = MCP_TASK
    mcp_server: ClassVar[str]
    mcp_tool: ClassVar[str]

    def run(self, args: McpInput, ctx: ToolContext) -> ToolResult:
        from workers.tools.mcp.client import McpError, manager_for_process
        from workers.tools.mcp.results import to_result

        if ctx.store is None:
            raise ToolError("this worker has no store for MCP grants")
        mcp = McpStore(ctx.store())
        grants = mcp.grants(ctx.context.agent_id, ctx.context.user_id)
        if not granted(grants, self.mcp_server, self.mcp_tool):  # checked again here
            raise ToolError(f"{self.name} is not granted to this agent or user")
        arguments = args.model_dump()
        try:
            raw = manager_for_process(ctx.settings).call(
                self.mcp_server, self.mcp_tool, arguments, self.timeout_s
            )
        except McpError as exc:
            raise ToolError(str(exc)) from None
        return to_result(self.mcp_server, raw, ctx.settings.mcp_output_cap_chars)


class McpRegistry(Registry):
    """The `mcp` worker's registry: native tools, and MCP tools resolved from the catalog
    by their exposed name (a lookup, never parsing the name)."""

    def __init__(self, base: Registry, settings: Settings) -> None:
        super().__init__()
        self._tools = dict(base._tools)
        self._schemas = base._schemas
        self.settings = settings
        self._store: Store | None = None

    def get(self, name: str) -> Tool[Any] | None:
        found = super().get(name)
        if found is not None or not name.startswith("mcp_"):
            return found
        if self._store is None:
            self._store = Store(self.settings.database_url)
        row = McpStore(self._store).resolve(name)
        if row is None:
            return None
        return tool_class(row, self.settings.mcp_call_timeout_s)()


_classes: dict[tuple[str, str], type[McpTool]] = {}


def tool_class(row: McpToolRow, timeout_s: float) -> type[McpTool]:
    """The declaration of one catalog entry (made once per distinct entry)."""
    fields = [row.server, row.tool, row.description, row.input_schema, timeout_s]
    key = (row.exposed_name, json.dumps(fields, sort_keys=True))
    if key not in _classes:
        schema: dict[str, Any] = {"type": "object", "properties": {}, **row.input_schema}
        _classes[key] = type(
            f"Mcp_{row.exposed_name}",
            (McpTool,),
            {
                "name": row.exposed_name,
                "description": row.description or f"{row.tool} (MCP server {row.server})",
                "input_schema": schema,
                "timeout_s": timeout_s,
                "mcp_server": row.server,
                "mcp_tool": row.tool,
            },
        )
    return _classes[key]
