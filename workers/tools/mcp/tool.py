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
        from workers.tools.mcp.elicit import Asker
        from workers.tools.mcp.results import to_result

        if ctx.store is None:
            raise ToolError("this worker has no store for MCP grants")
        mcp = McpStore(ctx.store())
        grants = mcp.grants(ctx.context.agent_id, ctx.context.user_id)
        if not granted(grants, self.mcp_server, self.mcp_tool):  # checked again here
            raise ToolError(f"{self.name} is not granted to this agent or user")
        try:
            raw = manager_for_process(ctx.settings).call(
                self.mcp_server,
                self.mcp_tool,
                args.model_dump(),
                progress=progress_events(ctx, self.name),
                workspace=ctx.context.workspace,
                cancelled=ctx.cancelled,
                asker=Asker(ctx, self.name, self.mcp_server),
            )
        except McpError as exc:
            raise ToolError(str(exc)) from None

        def keep(data: bytes, mime: str, name: str) -> Any:  # images, audio, blobs
            return ctx.keep_artifact(data, mime, name)

        return to_result(self.mcp_server, raw, ctx.settings.mcp_output_cap_chars, keep)


def progress_events(ctx: ToolContext, name: str) -> Any:
    """The server's progress notifications as `tool_call_progress` events of the job, those
    that came together in one round trip; a message passes the worker's scrubber (a
    server may echo what it was given)."""
    if ctx.redis is None or not ctx.job_id:
        return None
    from broker.protocol import Event
    from broker.redis import events

    client, ttl = ctx.redis, ctx.settings.events_ttl_s

    def report(heard: list[tuple[float, float | None, str | None]]) -> None:
        batch = []
        for progress, total, message in heard:
            data = {"call_id": ctx.call_id, "name": name, "progress": progress, "total": total}
            if message:
                data["message"] = ctx.scrub(message) if ctx.scrub is not None else message
            batch.append(Event(type="tool_call_progress", job_id=ctx.job_id, data=data))
        pipe = client.pipeline(transaction=False)
        events.add(pipe, batch, ttl)
        pipe.execute()

    return report


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
        return tool_class(row, self.settings.mcp_call_total_s)()


_classes: dict[tuple[str, str], type[McpTool]] = {}


def tool_class(row: McpToolRow, timeout_s: float) -> type[McpTool]:
    """The declaration of one catalog entry (made once per distinct entry); `timeout_s` is
    the longest a call may take (the settings' total), unless its server's is shorter."""
    timeout_s = min(row.total_timeout_s or timeout_s, timeout_s)
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
