"""Permission resolution: one decision per call, from every source, fail closed.

Order (agent-tool-architecture.md, "Permission rules are resolved, not overridden"):
deny rules (final, whatever their source) → ask rules → the tool's own checks → safety
checks (protected paths, never auto-approved) → permission mode → allow rules → the tool's
default. Hooks tighten: a hook's deny is final, its ask asks, its allow counts as an allow
rule and so skips neither a deny nor an ask rule.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from broker.config.policy import PermissionMode, PermissionRules
from broker.config.settings import Settings
from broker.protocol import Group
from orchestrator.calls.rules import Rule, rules_from
from workers.paths import rule_pattern
from workers.tool import SideEffect, Tool, ToolInput, Verdict

Behavior = Literal["allow", "ask", "deny"]


@dataclass(frozen=True)
class Decision:
    behavior: Behavior
    layer: str  # rule, hook, tool, safety, mode, default, grant, approval, policy, rate_limit
    reason: str
    by: str = ""  # the rule, hook or person that decided
    # not asked only because commands run confined: a worker that does not confine refuses it
    confined: bool = False


@dataclass(frozen=True)
class HookVerdict:
    behavior: Behavior | None
    reason: str = ""
    source: str = ""


def exec_approvals(settings: Settings) -> tuple[PermissionRules, dict[str, Behavior]]:
    """goclaw's exec approval modes as rules: security `deny` / `allowlist` / `full` and ask
    `off` / `on-miss` / `always`; with ask `off`, a command the allowlist misses is denied
    instead of asked."""
    rules = PermissionRules()
    if settings.exec_security == "deny":
        rules.deny.append("exec")
    elif settings.exec_security == "full":
        rules.allow.append("exec")
    else:
        rules.allow += [f"exec({pattern})" for pattern in settings.exec_allowlist]
    if settings.exec_ask == "always":
        rules.ask.append("exec")
    defaults: dict[str, Behavior] = {"exec": "deny"} if settings.exec_ask == "off" else {}
    return rules, defaults


def job_rules(
    settings: Settings, job: PermissionRules, agent: str = "main", user: str = ""
) -> list[Rule]:
    """Rules of every source, highest first: managed, exec approvals, job, agent, user."""
    sources = [
        (settings.permissions, "managed"),
        (exec_approvals(settings)[0], "exec approvals"),
        (job, "job"),
        (settings.agent_permissions.get(agent, PermissionRules()), f"agent {agent}"),
        (settings.user_permissions.get(user, PermissionRules()), f"user {user}"),
    ]
    return [rule for config, source in sources for rule in rules_from(config, source)]


def decide(
    tool: Tool[Any],
    args: ToolInput,
    rules: list[Rule],
    mode: PermissionMode,
    workspace: str,
    hook: HookVerdict | None = None,
    defaults: dict[str, Behavior] | None = None,
    contained: bool = False,
) -> Decision:
    """`contained`: commands run confined (bubblewrap or the sandbox), so a tool's
    "confined" verdict (targets that cannot be known) needs no one's approval."""
    needs_confinement = False
    verdict: tuple[Verdict, str] | None = tool.permission_check(args, workspace)
    if verdict is not None and verdict[0] == "confined":
        needs_confinement = contained
        if not contained:
            verdict = ("ask", f"{verdict[1]}; commands here run unconfined, so it is asked")
    decision = _decide(tool, args, rules, mode, workspace, hook, defaults, verdict)
    if needs_confinement and decision.behavior == "allow":
        return replace(decision, confined=True)
    return decision


def _decide(
    tool: Tool[Any],
    args: ToolInput,
    rules: list[Rule],
    mode: PermissionMode,
    workspace: str,
    hook: HookVerdict | None,
    defaults: dict[str, Behavior] | None,
    verdict: tuple[Verdict, str] | None,
) -> Decision:
    def first(kind: str) -> Rule | None:
        return next((r for r in rules if r.kind == kind and r.covers(tool, args, workspace)), None)

    if denied := first("deny"):
        return Decision(
            "deny", "rule", f"{tool.name} is denied by the rule {denied.raw}", str(denied)
        )
    if hook and hook.behavior == "deny":
        return Decision(
            "deny", "hook", hook.reason or f"{tool.name} was blocked by a hook", hook.source
        )
    bypass = mode == "bypassPermissions"
    if not bypass and (asked := first("ask")):
        return Decision("ask", "rule", f"the rule {asked.raw} asks before {tool.name}", str(asked))
    if hook and hook.behavior == "ask":
        return Decision("ask", "hook", hook.reason or "a hook asks for approval", hook.source)
    if verdict is not None:
        behavior, reason = verdict
        if behavior == "deny":
            return Decision("deny", "tool", reason, tool.name)
        if behavior == "ask" and not bypass:
            return Decision("ask", "tool", reason, tool.name)
    if protected := tool.protected_paths(args, workspace):
        return Decision(
            "ask",
            "safety",
            f"{protected[0]} is a protected path; writes there are never approved automatically",
            "protected paths",
        )
    if mode == "plan" and tool.side_effect != SideEffect.read:
        return Decision(
            "deny", "mode", f"plan mode allows read-only tools; {tool.name} is not", mode
        )
    if bypass and tool.bypassable(args):
        return Decision("allow", "mode", "bypassPermissions", mode)
    if mode == "acceptEdits" and tool.group == Group.fs:
        return Decision("allow", "mode", "acceptEdits approves file edits", mode)
    allows = [r for r in rules if r.kind == "allow" and r.names(tool)]
    if allows and tool.allowed_by([r.specifier for r in allows], args, workspace):
        used = ", ".join(r.raw for r in allows)
        return Decision("allow", "rule", f"allowed by {used}", "; ".join(map(str, allows)))
    if hook and hook.behavior == "allow":
        return Decision("allow", "hook", hook.reason or "allowed by a hook", hook.source)
    default = (defaults or {}).get(tool.name, tool.default_for(args))
    if default == "deny":
        return Decision(
            "deny",
            "default",
            f"{tool.name} is not allowed here: no rule allows this call",
            tool.name,
        )
    return Decision(default, "default", f"{tool.name} defaults to {default}", tool.name)


NETWORK_RULE = "network"


def network_allowed(settings: Settings, rules: list[Rule]) -> bool:
    """Whether this job's confined commands get the network: the setting, or an allow
    rule `network` from any source, and no deny rule `network` (deny is final)."""
    named = [r for r in rules if r.tool == NETWORK_RULE and r.specifier is None]
    if any(r.kind == "deny" for r in named):
        return False
    return settings.exec_network or any(r.kind == "allow" for r in named)


def hidden_paths(rules: list[Rule], workspace: str) -> list[str]:
    """Workspace globs that deny or ask rules on read tools keep from directory walks."""
    out = []
    for rule in rules:
        if rule.kind != "allow" and rule.tool == "read_file" and rule.specifier:
            pattern, absolute = rule_pattern(rule.specifier, workspace)
            if not absolute:
                out.append(pattern)
    return out
