"""Helpers shared by the fs tools: the workspace of a call, whole-file reads and writes,
and how path permission rules apply to them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, Protocol

from workers.paths import PROTECTED_DIRS, Missing, Workspace, path_rule_matches
from workers.tool import RuleKind, Tool, ToolContext, ToolError

MAX_EDIT_BYTES = 16 * 1024 * 1024


def workspace(ctx: ToolContext, *, skills: bool = False) -> Workspace:
    """The call's workspace; with `skills`, reads may also resolve inside the configured
    skill roots (read_file and list_files, so a skill found by skill_search can be read)."""
    c = ctx.context
    roots = ctx.settings.skill_roots if skills else None
    return Workspace(c.workspace, c.writable_paths, c.hidden_paths, read_roots=roots)


class _HasPath(Protocol):
    path: str


class PathRules(Tool[Any]):
    """Permission rules of tools whose input has a `path`: `read_file(./secrets/**)`
    governs every read tool, `edit_file(src/**)` and `write_file(...)` both write tools."""

    writes: ClassVar[bool] = False

    def rule_matches(self, specifier: str, args: _HasPath, workspace: str, kind: RuleKind) -> bool:
        return path_rule_matches(specifier, args.path, workspace)

    def protected_paths(self, args: _HasPath, workspace: str) -> list[str]:
        if not self.writes:
            return []
        rel = os.path.relpath(os.path.normpath(os.path.join(workspace, args.path)), workspace)
        return [rel] if any(part in PROTECTED_DIRS for part in Path(rel).parts) else []

    def rules_for(self, args: _HasPath, workspace: str) -> list[str]:
        rel = os.path.relpath(os.path.normpath(os.path.join(workspace, args.path)), workspace)
        return [f"{self.name}({rel})"]


class ReadRules(PathRules):
    rule_names = ("read_file",)


class WriteRules(PathRules):
    rule_names = ("edit_file", "write_file")
    writes = True


def decoded(data: bytes, path: str, limit: int = MAX_EDIT_BYTES) -> str:
    """A whole text file's bytes as text (up to `limit` bytes; binary refused)."""
    if len(data) > limit:
        raise ToolError(f"'{path}' is larger than {limit} bytes")
    if b"\x00" in data[:8192]:
        raise ToolError(f"'{path}' is a binary file")
    return data.decode("utf-8", errors="replace")


def open_to_change(
    ws: Workspace, path: str, ctx: ToolContext, *, create: bool, append: bool = False
) -> tuple[BinaryIO, bool]:
    """`path` opened once to be read and written (created with its parents if `create`,
    once the call's claim lets it act), and whether it existed: its prior version is read
    through the descriptor that then writes the new one (one path resolution, where a
    check and two opens made four)."""
    flags = os.O_RDWR | (os.O_APPEND if append else 0)
    try:
        return os.fdopen(ws.open(path, flags, write=True), "r+b"), True
    except Missing:
        if not create:
            raise
    ctx.claimed()
    ws.make_parents(path)
    return os.fdopen(ws.open(path, flags | os.O_CREAT, write=True), "r+b"), False


def put_text(fh: BinaryIO, text: str, *, append: bool = False) -> int:
    """Append `text` (the file was opened to append), or replace the file's content with
    it: written over the old bytes, then cut to its length. Not truncated first: ext4
    flushes a file truncated to zero when it is closed (`auto_da_alloc`), 0.1 ms a write
    on this machine's disk."""
    data = text.encode()
    if not append:
        fh.seek(0)
    fh.write(data)
    if not append:
        fh.truncate()
    return len(data)
