"""A real MCP server over stdio whose tool list comes in pages of two (five tools), for the
bridge's pagination: `python -m tests.mcp_servers.paged_server`."""

from __future__ import annotations

import anyio
import mcp.types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server

TOOLS = [
    types.Tool(
        name=f"t{i}", description=f"tool {i}", input_schema={"type": "object", "properties": {}}
    )
    for i in range(5)
]


async def list_tools(
    ctx: object, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    start = int(params.cursor) if params and params.cursor else 0
    following = str(start + 2) if start + 2 < len(TOOLS) else None
    return types.ListToolsResult(tools=TOOLS[start : start + 2], next_cursor=following)


async def call_tool(ctx: object, params: types.CallToolRequestParams) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=f"called {params.name}")])


server = Server("clawq-test-paged", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
