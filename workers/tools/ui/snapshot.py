"""Page snapshots for the model: Playwright's accessibility tree with element refs
(`aria_snapshot(mode="ai")`: `- button "Submit" [ref=e10]`), without presentation (cursor,
focus), cut down to what can be acted on unless the whole tree is asked for, capped with a
marker, and as a diff against the previous snapshot of the tab so a second look costs only
what changed."""

from __future__ import annotations

import difflib
import re

# how an element looks or where focus is, not what it is or what may be done with it: a
# `[cursor=pointer]` ended every link of a long list (a third of its snapshot)
NOISE = re.compile(r" \[(?:active|cursor=[\w-]+)\]")
ROLE = re.compile(r"^\s*- (?:\"[^\"]*\"|([a-z]+))")
REF = re.compile(r"\[ref=([a-z0-9]+)\]")
INTERACTIVE = frozenset(
    {
        "button",
        "link",
        "textbox",
        "searchbox",
        "checkbox",
        "radio",
        "combobox",
        "listbox",
        "option",
        "menuitem",
        "menuitemcheckbox",
        "menuitemradio",
        "tab",
        "slider",
        "spinbutton",
        "switch",
        "treeitem",
    }
)
KEPT = INTERACTIVE | {"heading", "dialog", "alert"}  # what orients the model too


def lines_of(tree: str, interactive: bool) -> list[str]:
    """The snapshot's lines; with `interactive`, only actionable elements (and headings,
    dialogs and alerts), unindented, each with its ref."""
    lines = [NOISE.sub("", line) for line in tree.splitlines()]
    if not interactive:
        return lines
    kept = []
    for line in lines:
        role = ROLE.match(line)
        if role and role.group(1) in KEPT and (REF.search(line) or role.group(1) == "option"):
            kept.append(line.strip().rstrip(":"))
    return kept


def cap(lines: list[str], max_chars: int) -> str:
    text = "\n".join(lines)
    if len(text) <= max_chars:
        return text
    cut = text[:max_chars]
    cut = cut[: cut.rfind("\n")] if "\n" in cut else cut
    return (
        f"{cut}\n[snapshot cut at {len(cut)} of {len(text)} characters; scope it with "
        "selector, or use diff]"
    )


def diff(before: list[str], after: list[str]) -> str:
    """What changed between two snapshots of a tab, as added and removed lines."""
    if before == after:
        return "[no change since the last snapshot]"
    added: list[str] = []
    removed: list[str] = []
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for op, a0, a1, b0, b1 in matcher.get_opcodes():
        if op in ("replace", "delete"):
            removed.extend(before[a0:a1])
        if op in ("replace", "insert"):
            added.extend(after[b0:b1])
    out = [f"[changes since the last snapshot: {len(added)} added, {len(removed)} removed]"]
    out += [f"+ {line.strip()}" for line in added]
    out += [f"- {line.strip()}" for line in removed]
    return "\n".join(out)
