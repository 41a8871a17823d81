"""search: a regular expression over file contents, answered as `path:line: text`."""

from __future__ import annotations

import os

import regex
from pydantic import Field

from broker.protocol import Group
from workers.tool import SideEffect, Tool, ToolContext, ToolError, ToolInput, ToolResult
from workers.tools.fs.common import ReadRules, workspace
from workers.tools.fs.find import GLOB_FLAGS, walk_files

MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_LINE_CHARS = 300
REGEX_TIMEOUT_S = 2.0  # per file: a pathological pattern cannot hang the worker


class SearchInput(ToolInput):
    pattern: str = Field(description="Regular expression (Python syntax)")
    path: str = Field(".", description="File or directory to search, relative to the workspace")
    include: str | None = Field(None, description="Only files matching this glob, e.g. '*.py'")
    ignore_case: bool = False


class Search(ReadRules, Tool[SearchInput]):
    name = "search"
    description = (
        "Search file contents in the workspace with a regular expression. "
        "Answers one match per line as `path:line: text`."
    )
    group = Group.fs
    input_model = SearchInput
    side_effect = SideEffect.read
    default_permission = "allow"
    timeout_s = 60.0

    def concurrency_safe(self, args: SearchInput) -> bool:
        return True

    def run(self, args: SearchInput, ctx: ToolContext) -> ToolResult:
        from wcmatch import glob as wcglob

        ws = workspace(ctx)
        try:
            compiled = regex.compile(args.pattern, regex.IGNORECASE if args.ignore_case else 0)
        except regex.error as exc:
            raise ToolError(f"invalid regular expression: {exc}") from None
        start = ws.resolve(args.path)
        files = [start] if os.path.isfile(start) else walk_files(ws, start)
        cap = ctx.settings.search_max_results
        hits: list[str] = []
        total = 0
        for full in files:
            rel = os.path.relpath(full, ws.root)
            if args.include and not wcglob.globmatch(rel, args.include, flags=GLOB_FLAGS):
                continue
            text = _text_of(full)
            if text is None:
                continue
            try:
                for number, line in _matching_lines(compiled, text):
                    total += 1
                    if len(hits) < cap:
                        hits.append(f"{rel}:{number}: {line[:MAX_LINE_CHARS]}")
            except TimeoutError:
                hits.append(f"{rel}: [pattern took too long on this file; simplify it]")
        if not hits:
            return ToolResult(for_llm=f"no matches for /{args.pattern}/", metadata={"matches": 0})
        text = "\n".join(hits)
        if total > cap:
            text += f"\n[{total - cap} more matches not shown; narrow the pattern or path]"
        return ToolResult(for_llm=text, metadata={"matches": total})


def _text_of(path: str) -> str | None:
    try:
        if os.path.getsize(path) > MAX_FILE_BYTES:
            return None
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    if b"\x00" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def _matching_lines(compiled: regex.Pattern[str], text: str) -> list[tuple[int, str]]:
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        if compiled.search(line, timeout=REGEX_TIMEOUT_S):
            found.append((number, line.strip()))
    return found
