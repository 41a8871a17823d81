"""memory_get: lines of one memory document, the user's copy first, then the global one."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from broker.protocol import Group
from broker.stores.memory import MemoryStore
from workers.tool import SideEffect, Tool, ToolContext, ToolError, ToolInput, ToolResult
from workers.tools.fs.intercept import Memory, virtual_path

MAX_LINES = 2000


class MemoryGetInput(ToolInput):
    model_config = ConfigDict(populate_by_name=True)

    path: str = Field(description="A memory path: MEMORY.md, memory.md or memory/…")
    from_: int = Field(1, ge=1, alias="from", description="First line (1-based)")
    lines: int = Field(200, ge=1, le=MAX_LINES, description="How many lines")


class MemoryGet(Tool[MemoryGetInput]):
    name = "memory_get"
    description = "Read lines of a memory document found by memory_search (path, from, lines)."
    group = Group.memory
    input_model = MemoryGetInput
    side_effect = SideEffect.read
    default_permission = "allow"
    timeout_s = 30.0

    def concurrency_safe(self, args: MemoryGetInput) -> bool:
        return True

    def run(self, args: MemoryGetInput, ctx: ToolContext) -> ToolResult:
        if ctx.store is None:
            raise ToolError("memory_get needs the database; none is configured here")
        c = ctx.context
        rel = virtual_path(args.path, c.workspace) or ""
        if not Memory().claims(rel):
            raise ToolError(
                f"'{args.path}' is not a memory path; use MEMORY.md, memory.md or memory/…"
            )
        doc = MemoryStore(ctx.store().conn).get(c.agent_id, c.user_id, rel)
        if doc is None:
            raise ToolError(f"'{rel}' is not in memory; memory_search to find what is")
        lines = doc.content.splitlines()
        first = args.from_
        if lines and first > len(lines):
            raise ToolError(f"from {first} is past the end ({len(lines)} lines)")
        part = lines[first - 1 : first - 1 + args.lines]
        last = first + len(part) - 1
        text = "\n".join(part)
        if last < len(lines):
            text += f"\n[lines {first}-{last} of {len(lines)}; more with from={last + 1}]"
        return ToolResult(
            for_llm=text or "[empty document]",
            for_user=f"memory_get {rel}:{first}-{last}",
            metadata={
                "path": rel,
                "from": first,
                "to": last,
                "lines": len(lines),
                "scope": "user" if doc.user_id else "global",
            },
        )
