"""list_files and glob: what exists in the workspace, never following links out of it."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import ClassVar

from pydantic import Field
from wcmatch import glob as wcglob

from broker.protocol import Group
from workers.paths import VCS_DIRS, Workspace
from workers.tool import SideEffect, Tool, ToolContext, ToolError, ToolInput, ToolResult
from workers.tools.fs.common import ReadRules, workspace
from workers.tools.fs.intercept import ROUTED, Interceptor, listed, virtual_path

GLOB_FLAGS = wcglob.GLOBSTAR | wcglob.MATCHBASE | wcglob.BRACE  # '*.py' matches at any depth


def walk_files(ws: Workspace, start: str) -> Iterator[str]:
    """Real paths of the regular files under `start`, inside the workspace, VCS dirs skipped."""
    for top, dirs, files in os.walk(start, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in VCS_DIRS)
        for name in sorted(files):
            full = os.path.join(top, name)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode) and not ws.contains(os.path.realpath(full)):
                continue
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                continue  # a hard link may alias a file outside the workspace
            if ws.is_hidden(os.path.realpath(full)):
                continue  # denied to read tools by the job's permission rules
            yield full


class ListFilesInput(ToolInput):
    path: str = Field(".", description="Directory, relative to the workspace")


class ListFiles(ReadRules, Tool[ListFilesInput]):
    name = "list_files"
    description = "List a directory of the workspace; directories end with '/'."
    group = Group.fs
    input_model = ListFilesInput
    side_effect = SideEffect.read
    default_permission = "allow"
    timeout_s = 30.0

    def concurrency_safe(self, args: ListFilesInput) -> bool:
        return True

    interceptors: ClassVar[tuple[Interceptor, ...]] = ROUTED

    def run(self, args: ListFilesInput, ctx: ToolContext) -> ToolResult:
        rel = virtual_path(args.path, ctx.context.workspace)
        virtual: set[str] = set()
        owned = False
        if rel is not None:
            found = [i.listing(rel, ctx) for i in self.interceptors]
            virtual.update(listed([f for f in found if f is not None], rel, ctx))
            owned = any(i.owns_directory(rel) for i in self.interceptors)
        entries = sorted(virtual if owned else virtual | self._disk(args.path, ctx))
        cap = ctx.settings.list_max_entries
        shown = entries[:cap]
        text = "\n".join(shown) if shown else "[empty directory]"
        if len(entries) > cap:
            text += f"\n[{len(entries) - cap} more entries not shown]"
        return ToolResult(for_llm=text, metadata={"entries": len(entries)})

    @staticmethod
    def _disk(path: str, ctx: ToolContext) -> set[str]:
        real = workspace(ctx, skills=True).resolve(path)
        if not os.path.isdir(real):
            raise ToolError(f"'{path}' is not a directory")
        entries = set()
        with os.scandir(real) as it:
            for entry in it:
                suffix = "/" if entry.is_dir(follow_symlinks=False) else ""
                if entry.is_symlink():
                    suffix = "@"
                entries.add(entry.name + suffix)
        return entries


class GlobInput(ToolInput):
    pattern: str = Field(description="Glob pattern, e.g. '**/*.py' or 'src/*.md'")
    path: str = Field(".", description="Directory to search from, relative to the workspace")


class Glob(ReadRules, Tool[GlobInput]):
    name = "glob"
    description = "Find files whose path matches a glob pattern ('**' spans directories)."
    group = Group.fs
    input_model = GlobInput
    side_effect = SideEffect.read
    default_permission = "allow"
    timeout_s = 30.0

    def concurrency_safe(self, args: GlobInput) -> bool:
        return True

    def run(self, args: GlobInput, ctx: ToolContext) -> ToolResult:
        ws = workspace(ctx)
        start = ws.resolve(args.path)
        if os.path.isabs(args.pattern) or ".." in PurePosixPath(args.pattern).parts:
            raise ToolError("pattern must be relative and must not contain '..'")
        cap = ctx.settings.search_max_results
        matches = []
        for full in walk_files(ws, start):
            rel = os.path.relpath(full, start)
            if wcglob.globmatch(rel, args.pattern, flags=GLOB_FLAGS):
                matches.append(os.path.relpath(full, ws.root))
        shown = matches[:cap]
        text = "\n".join(shown) if shown else f"no files match {args.pattern}"
        if len(matches) > cap:
            text += f"\n[{len(matches) - cap} more files not shown; narrow the pattern]"
        return ToolResult(for_llm=text, metadata={"matches": len(matches)})
