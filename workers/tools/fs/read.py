"""read_file: a page of a text file, numbered like `cat -n`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import ClassVar

from pydantic import Field

from broker.protocol import Group
from workers.tool import SideEffect, Tool, ToolContext, ToolInput, ToolResult
from workers.tools.fs.common import ReadRules, workspace
from workers.tools.fs.intercept import ROUTED, Interceptor, routed, virtual_path

MAX_LINE_CHARS = 2000


class ReadFileInput(ToolInput):
    path: str = Field(
        description="File path, relative to the workspace (or a SKILL.md path from skill_search)"
    )
    offset: int = Field(1, ge=1, description="First line to read (1-based)")
    limit: int | None = Field(None, ge=1, description="Number of lines to read")


class ReadFile(ReadRules, Tool[ReadFileInput]):
    name = "read_file"
    description = (
        "Read a text file from the workspace. Lines are numbered like `cat -n`. "
        "Use offset and limit to read large files page by page."
    )
    group = Group.fs
    input_model = ReadFileInput
    side_effect = SideEffect.read
    default_permission = "allow"
    timeout_s = 30.0

    def concurrency_safe(self, args: ReadFileInput) -> bool:
        return True

    interceptors: ClassVar[tuple[Interceptor, ...]] = ROUTED

    def run(self, args: ReadFileInput, ctx: ToolContext) -> ToolResult:
        if routed_to := routed(self.interceptors, args.path, ctx):
            rel = virtual_path(args.path, ctx.context.workspace) or args.path
            found = routed_to.read(rel, ctx)
            result = page(iter(found.content.splitlines()), args, ctx)
            result.metadata["version"] = found.target_version
            return result
        fd = workspace(ctx, skills=True).open(args.path, os.O_RDONLY)
        with os.fdopen(fd, "rb") as fh:
            if b"\x00" in fh.read(8192):
                return ToolResult.error(f"'{args.path}' is a binary file; read_file shows text")
            fh.seek(0)
            lines = (raw.decode("utf-8", errors="replace").rstrip("\r\n") for raw in fh)
            return page(lines, args, ctx)


def page(lines: Iterator[str], args: ReadFileInput, ctx: ToolContext) -> ToolResult:
    """The requested lines, numbered, within the page cap, with a footer to read on."""
    limit = args.limit or ctx.settings.read_default_lines
    cap = ctx.settings.read_max_bytes
    out: list[str] = []
    size = 0
    last = args.offset - 1
    footer = ""
    total = 0
    for number, line in enumerate(lines, start=1):
        total = number
        if number < args.offset or len(out) >= limit or footer:
            continue
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS] + " [line cut]"
        entry = f"{number:>6}\t{line}"
        if size + len(entry) + 1 > cap and out:
            footer = (
                f"[truncated at the {cap}-byte page cap after line {last}; "
                f"read on with offset={last + 1}]"
            )
            continue
        out.append(entry)
        size += len(entry) + 1
        last = number
    if not footer and last < total:
        footer = f"[showed lines {args.offset}-{last} of {total}; read on with offset={last + 1}]"
    if not out and total and args.offset > total:
        return ToolResult.error(f"offset {args.offset} is past the end ({total} lines)")
    text = "\n".join(out) if out else "[empty file]"
    if footer:
        text += "\n" + footer
    return ToolResult(
        for_llm=text,
        for_user=f"read {args.path} lines {args.offset}-{last}",
        metadata={"lines": total, "first": args.offset, "last": last},
    )
