"""Helpers shared by the fs tools: the workspace of a call, whole-file reads and writes."""

from __future__ import annotations

import os

from workers.paths import Workspace
from workers.tool import ToolContext, ToolError

MAX_EDIT_BYTES = 16 * 1024 * 1024


def workspace(ctx: ToolContext) -> Workspace:
    return Workspace(ctx.context.workspace, ctx.context.writable_paths)


def read_text(ws: Workspace, path: str, limit: int = MAX_EDIT_BYTES) -> str:
    fd = ws.open(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ToolError(f"'{path}' is larger than {limit} bytes")
    if b"\x00" in data[:8192]:
        raise ToolError(f"'{path}' is a binary file")
    return data.decode("utf-8", errors="replace")


def write_text(ws: Workspace, path: str, text: str, *, append: bool = False) -> int:
    ws.make_parents(path)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = ws.open(path, flags, write=True)
    data = text.encode()
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return len(data)
