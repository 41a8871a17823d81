"""A real MCP server over streamable HTTP (or SSE) for the bridge's tests, built on the MCP
SDK's server: `python -m tests.mcp_servers.web_server streamable-http PORT`.

It has tools that add, sleep, fail, return an
image, and page its tool list (more tools than one page)."""

from __future__ import annotations

import base64
import sys
import time

from mcp.server.mcpserver import Image, MCPServer

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)

server = MCPServer("clawq-test-web", log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def nap(seconds: float) -> str:
    """Sleep, then say so."""
    time.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def fail(message: str) -> str:
    """Always fails."""
    raise ValueError(message)


@server.tool()
def picture() -> Image:
    """A one-pixel PNG."""
    return Image(data=PNG, format="png")


if __name__ == "__main__":
    server.run(sys.argv[1], host="127.0.0.1", port=int(sys.argv[2]))
