"""Configuration models for what a model may call: tool policy, permission rules, hooks.

They are plain data, read from settings (JSON in `CLAWQ_*` variables) and from each job;
the orchestrator's policy engine, rule matcher and hook runner give them meaning.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PermissionMode = Literal["default", "acceptEdits", "plan", "bypassPermissions"]


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class PermissionRules(_Config):
    """Claude Code's rule arrays: `Tool` or `Tool(specifier)`, e.g. `exec(git status *)`."""

    allow: list[str] = Field(default_factory=list)
    ask: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)


class ProviderPolicy(_Config):
    profile: str | None = None
    allow: list[str] | None = None


class AgentPolicy(_Config):
    allow: list[str] | None = None
    deny: list[str] = Field(default_factory=list)
    also_allow: list[str] = Field(default_factory=list, alias="alsoAllow")
    by_provider: dict[str, ProviderPolicy] = Field(default_factory=dict, alias="byProvider")


class ToolPolicy(_Config):
    """Which tools the model sees (goclaw §5): profile, allow lists, deny lists, alsoAllow."""

    profile: str = "full"
    by_provider: dict[str, ProviderPolicy] = Field(default_factory=dict, alias="byProvider")
    allow: list[str] | None = None
    deny: list[str] = Field(default_factory=list)
    also_allow: list[str] = Field(default_factory=list, alias="alsoAllow")
    group_allow: list[str] | None = Field(None, alias="groupAllow")
    agents: dict[str, AgentPolicy] = Field(default_factory=dict)


class HookCommand(_Config):
    type: Literal["command"] = "command"
    command: str
    timeout: float = Field(60.0, gt=0, description="seconds")


class HookMatcher(_Config):
    matcher: str = ""  # tool names (`exec|write_file`, Claude Code names too) or a regex
    hooks: list[HookCommand]


class HooksConfig(_Config):
    """Claude Code's `hooks` settings block, for the two tool events."""

    pre_tool_use: list[HookMatcher] = Field(default_factory=list, alias="PreToolUse")
    post_tool_use: list[HookMatcher] = Field(default_factory=list, alias="PostToolUse")


USER_MODES: tuple[PermissionMode, ...] = ("default", "acceptEdits", "plan")  # bypass: granted


class Ceiling(_Config):
    """The most one user's jobs may ask for, set by an admin (live key `user_ceilings`).

    `allow`: the rules a job may carry in its allow list. `*` is any rule but `network`;
    a tool name (`exec`) is any rule of that tool; `exec(git *)` is that rule only.
    `modes`: the permission modes its jobs may use (`bypassPermissions` only if granted).
    `network`: its jobs may allow `network` (confined commands reach the network).
    `workspace_roots`: where its workspaces may lie, beside `CLAWQ_WORKSPACE_ROOT/<user>`;
    `{user}` in a root stands for the user's id."""

    allow: list[str] = Field(default_factory=lambda: ["*"])
    modes: list[PermissionMode] = Field(default_factory=lambda: list(USER_MODES))
    network: bool = False
    workspace_roots: list[str] = Field(default_factory=list)
