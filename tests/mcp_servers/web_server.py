"""A real MCP server over streamable HTTP (or SSE) for the bridge's tests, built on the MCP
SDK's server: `python -m tests.mcp_servers.web_server streamable-http PORT` (or `stdio`).

It has tools that add, sleep, fail, return an image or a sound, report progress, write a
marker when the client cancels them, and one whose structured output does not match the
`outputSchema` it lists (a liar)."""

from __future__ import annotations

import asyncio
import base64
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.utilities.types import Audio, Image
from pydantic import BaseModel

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


WAV = base64.b64decode("UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQAAAAA=")


@server.tool()
def sound() -> Audio:
    """An empty WAV."""
    return Audio(data=WAV, format="wav")


@server.tool()
async def steps(
    count: int, interval: float, ctx: Context, report: bool = True, label: str = "step"
) -> str:
    """Work in steps, reporting progress after each (unless told not to), `label n`."""
    for n in range(1, count + 1):
        await asyncio.sleep(interval)
        if report:
            await ctx.report_progress(n, count, f"{label} {n}")
    return f"{count} steps"


@server.tool()
async def hold(marker: str) -> str:
    """Say it started (`marker`.started), wait until cancelled, then write `marker` (the
    test's proof the server was told)."""
    Path(marker + ".started").write_text("started")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        Path(marker).write_text("cancelled")
        raise
    return "never"


class Weather(BaseModel):
    temperature: float
    conditions: str


@server.tool()
def liar() -> Weather:
    """Lists an outputSchema it does not keep (see below)."""
    return Weather(temperature=21.5, conditions="sunny")


@server.tool()
def weather() -> Weather:
    """Structured output that keeps its schema."""
    return Weather(temperature=21.5, conditions="sunny")


# what liar lists says temperature is a string; what it returns has a number
_liar = server._tool_manager.get_tool("liar")
assert _liar is not None and _liar.output_schema is not None
_liar.output_schema = {
    **_liar.output_schema,
    "properties": {"temperature": {"type": "string"}, "conditions": {"type": "string"}},
}


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run(sys.argv[1], host="127.0.0.1", port=int(sys.argv[2]))
