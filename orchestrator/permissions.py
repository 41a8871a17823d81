"""Interim permission gate: a tool whose default is "ask" runs only if the job allows it.

There is no approver yet, so "ask" fails closed. The full rule engine (sources, modes,
hooks, approvals) replaces this module.
"""

from __future__ import annotations

import re
from typing import Any

from workers.tool import Tool

RULE = re.compile(r"^(?P<tool>[A-Za-z0-9_-]+)(?:\((?P<spec>.*)\))?$")


def denial(tool: Tool[Any], allow: list[str]) -> str | None:
    """Why this call may not run, or None when it may."""
    allowed = {m.group("tool") for rule in allow if (m := RULE.match(rule)) and not m.group("spec")}
    if tool.name in allowed:
        return None
    if tool.default_permission == "allow":
        return None
    if tool.default_permission == "deny":
        return f"{tool.name} is denied by policy."
    return (
        f"{tool.name} needs permission and this job has no approver: submit the job with "
        f"allow=['{tool.name}'] (CLI: --allow {tool.name})."
    )


def writable_paths(allow: list[str]) -> list[str]:
    """Protected path patterns a job made writable, e.g. `write_file(.git/**)`."""
    return [m.group("spec") for rule in allow if (m := RULE.match(rule)) and m.group("spec")]
