"""Permission rules in the syntax Claude Code users know: `Tool` or `Tool(specifier)`.

`exec(npm run test *)`, `read_file(./secrets/**)`, `web_fetch(domain:example.com)`,
`mcp_<server>` / `mcp_<server>__<tool>`; Claude Code's names are aliases (`Bash`, `Read`,
`Edit`, `Write`, `WebFetch`, …). What a specifier means is up to the tool it names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from broker.config.policy import PermissionRules
from broker.errors import Invalid
from workers.tool import RuleKind, Tool, ToolInput

ALIASES = {
    "Bash": "exec",
    "Read": "read_file",
    "Edit": "edit_file",
    "MultiEdit": "edit_file",
    "Write": "write_file",
    "Grep": "search",
    "Glob": "glob",
    "LS": "list_files",
    "WebFetch": "web_fetch",
    "WebSearch": "web_search",
}
RULE = re.compile(r"^(?P<tool>[A-Za-z0-9_:-]+)(?:\((?P<spec>.*)\))?$", re.S)


class RuleError(Invalid, ValueError):
    """A permission rule that does not parse."""


@dataclass(frozen=True)
class Rule:
    kind: RuleKind
    tool: str
    specifier: str | None
    source: str  # managed, job, agent, user, grant
    raw: str

    @classmethod
    def parse(cls, raw: str, kind: RuleKind, source: str) -> Rule:
        match = RULE.match(raw.strip())
        if not match:
            raise RuleError(f"bad {kind} rule '{raw}': use Tool or Tool(specifier)")
        tool = ALIASES.get(match.group("tool"), match.group("tool"))
        spec = match.group("spec")
        spec = None if spec is None or spec.strip() in ("", "*") else spec.strip()
        return cls(kind, tool, spec, source, raw.strip())

    def names(self, tool: Tool[Any]) -> bool:
        if self.tool == tool.name or self.tool in tool.rule_names:
            return True
        return self.tool.startswith("mcp_") and tool.name.startswith(self.tool + "__")

    def covers(self, tool: Tool[Any], args: ToolInput, workspace: str) -> bool:
        if not self.names(tool):
            return False
        return self.specifier is None or tool.rule_matches(
            self.specifier, args, workspace, self.kind
        )

    def __str__(self) -> str:
        return f"{self.kind} rule {self.raw} ({self.source})"


def rules_from(config: PermissionRules, source: str) -> list[Rule]:
    """All rules of one source; every bad rule is reported at once."""
    rules, errors = [], []
    for kind, entries in (("deny", config.deny), ("ask", config.ask), ("allow", config.allow)):
        for raw in entries:
            try:
                rules.append(Rule.parse(raw, kind, source))  # type: ignore[arg-type]
            except RuleError as exc:
                errors.append(str(exc))
    if errors:
        raise RuleError("; ".join(errors))
    return rules
