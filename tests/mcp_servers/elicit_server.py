"""A real MCP server over stdio that asks the person during its calls (elicitation), built
with the MCP SDK: `python -m tests.mcp_servers.elicit_server [legacy]`.

`book` asks through a resolver (`Elicit`): on a 2026-07-28 session the question rides
the call's result (`InputRequiredResult`) and the call is retried with the answer. With
`legacy` the server serves only the older protocol (the client falls back to the initialize
handshake, 2025-11-25), and `reserve` asks with `ctx.elicit`: a request of its own, sent
to the client during the call. Each tool says
in its result what the server received: the content, or the action (decline, cancel)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

from mcp.server.elicitation import AcceptedElicitation, ElicitationResult
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from pydantic import BaseModel, Field

server = MCPServer("clawq-test-elicit", log_level="WARNING")


class Booking(BaseModel):
    date: str = Field(description="the day, YYYY-MM-DD")
    guests: int = Field(description="how many people", ge=1, le=12)
    outside: bool = Field(False, description="a table outside")


def ask_booking(table: str) -> Elicit[Booking]:
    return Elicit(f"Which day, and for how many, at table {table}?", Booking)


def said(table: str, got: ElicitationResult[Booking]) -> str:
    if isinstance(got, AcceptedElicitation):
        b = got.data
        return f"booked {table} on {b.date} for {b.guests}{' outside' if b.outside else ''}"
    return f"not booked: the person chose {got.action}"


@server.tool()
async def book(
    table: str, booking: Annotated[ElicitationResult[Booking], Resolve(ask_booking)]
) -> str:
    """Book a table: the person says when and for how many."""
    return said(table, booking)


@server.tool()
async def reserve(table: str, ctx: Context) -> str:
    """Like book, asking with ctx.elicit (servers of older protocol versions)."""
    return said(table, await ctx.elicit(f"Which day at table {table}?", Booking))


async def legacy_only(server: Any, read: Any, write: Any, **options: Any) -> None:
    """The SDK's serving loop, older era only (the SDK picks the era by the first request)."""
    from mcp.server import runner

    options.pop("session_id", None)
    try:
        await runner._serve_legacy_stream(server, read, write, session_id=None, **options)
    finally:
        await write.aclose()


if __name__ == "__main__":
    if sys.argv[1:] == ["legacy"]:
        import mcp.server.lowlevel.server as lowlevel

        lowlevel.serve_dual_era_loop = legacy_only  # type: ignore[assignment]
    server.run("stdio")
