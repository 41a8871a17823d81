"""The policy engine (goclaw §5): which tools a model sees.

Seven allow steps (global profile, provider profile override, global allow, provider allow,
agent allow, agent + provider allow, group allow) intersect; then the global and agent deny
lists subtract; then alsoAllow adds back; subagents lose the always-denied tools, and at the
maximum depth the leaf list too. Unlike the original, this fails closed: an unknown profile
or `group:` name is a configuration error, never "everything".
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.config.policy import ToolPolicy
from broker.errors import ConfigurationError
from broker.protocol import Group
from workers.registry import Registry

# the seed's inventory, by group; tools not yet registered simply are not there
GROUP_MEMBERS: dict[str, tuple[str, ...]] = {
    "fs": ("read_file", "write_file", "list_files", "edit_file", "search", "glob"),
    "runtime": ("exec", "process"),
    "web": ("web_search", "web_fetch"),
    "memory": ("memory_search", "memory_get"),
    "sessions": (
        "sessions_list",
        "sessions_history",
        "sessions_send",
        "sessions_spawn",
        "spawn",
        "subagents",
        "session_status",
        "read_result",
    ),
    "ui": ("browser", "canvas"),
    "automation": ("cron", "gateway"),
    "messaging": ("message", "ask_user"),
    "media": ("tts", "image", "skill_search"),
}
PROFILES: dict[str, tuple[str, ...] | None] = {
    "full": None,  # every registered tool
    "coding": (
        "group:fs",
        "group:runtime",
        "group:sessions",
        "group:memory",
        "image",
        "ask_user",
    ),
    "messaging": (
        "group:messaging",
        "sessions_list",
        "sessions_history",
        "sessions_send",
        "session_status",
    ),
    "minimal": ("session_status",),
}
SUBAGENT_ALWAYS_DENIED = (
    "gateway",
    "agents_list",
    "whatsapp_login",
    "session_status",
    "cron",
    "memory_search",
    "memory_get",
    "sessions_send",
)
SUBAGENT_LEAF_DENIED = (
    "sessions_list",
    "sessions_history",
    "sessions_spawn",
    "spawn",
    "subagent",
    "subagents",
)


class PolicyError(ConfigurationError):
    """The tool policy is misconfigured (unknown profile or group); nothing is assumed."""


class PolicyEngine:
    def __init__(self, registry: Registry, policy: ToolPolicy) -> None:
        self.registry = registry
        self.policy = policy
        self.groups = self._groups()
        self.validate()
        self._visible: dict[tuple[str, str, int, int], frozenset[str]] = {}

    def _groups(self) -> dict[str, set[str]]:
        names = set(self.registry.names())
        groups = {g: set(members) & names for g, members in GROUP_MEMBERS.items()}
        for tool in self.registry:  # a tool's declared group counts too (new tools, mcp)
            groups.setdefault(tool.group.value, set()).add(tool.name)
        mcp = {t.name for t in self.registry if t.group == Group.mcp}
        groups["goclaw"] = names - mcp  # all native tools
        groups["mcp"] = mcp
        for tool in self.registry:
            server = getattr(tool, "mcp_server", None)
            if tool.group == Group.mcp and server:
                groups.setdefault(f"mcp:{server}", set()).add(tool.name)
        return groups

    def validate(self) -> None:
        """Every profile and `group:` reference in the policy must exist."""
        p = self.policy
        lists: list[Iterable[str]] = [p.allow or [], p.deny, p.also_allow, p.group_allow or []]
        profiles = [p.profile]
        for prov in p.by_provider.values():
            lists.append(prov.allow or [])
            profiles.append(prov.profile or p.profile)
        for agent in p.agents.values():
            lists += [agent.allow or [], agent.deny, agent.also_allow]
            for prov in agent.by_provider.values():
                lists.append(prov.allow or [])
        problems = [f"unknown profile '{name}'" for name in profiles if name not in PROFILES]
        for entries in lists:
            for entry in entries:
                if entry.startswith("group:") and not self._known(entry[6:]):
                    problems.append(f"unknown group '{entry}'")
        if problems:
            raise PolicyError("tool policy: " + "; ".join(sorted(set(problems))))

    def _known(self, group: str) -> bool:
        """MCP groups are dynamic: `mcp` and `mcp:<server>` exist even while empty."""
        return group in self.groups or group == "mcp" or group.startswith("mcp:")

    def expand(self, entries: Iterable[str]) -> set[str]:
        out: set[str] = set()
        for entry in entries:
            if entry.startswith("group:"):
                if not self._known(entry[6:]):
                    raise PolicyError(f"tool policy: unknown group '{entry}'")
                out |= self.groups.get(entry[6:], set())
            else:
                out.add(entry)
        return out

    def visible(
        self, agent: str = "main", provider: str = "", depth: int = 0, max_depth: int = 1
    ) -> frozenset[str]:
        """The final list of tool names sent to the model: made once per agent, provider
        and depth, and shared by their jobs (a set of every tool's name per running job
        was 1 KB of its memory)."""
        key = (agent, provider, depth, max_depth)
        if (found := self._visible.get(key)) is None:
            found = self._visible[key] = frozenset(self._visible_now(*key))
        return found

    def _visible_now(self, agent: str, provider: str, depth: int, max_depth: int) -> set[str]:
        p = self.policy
        all_tools = set(self.registry.names())
        agent_policy = p.agents.get(agent)
        provider_policy = p.by_provider.get(provider)
        profile = (provider_policy and provider_policy.profile) or p.profile
        if profile not in PROFILES:
            raise PolicyError(f"tool policy: unknown profile '{profile}'")
        members = PROFILES[profile]
        tools = set(all_tools) if members is None else self.expand(members) & all_tools
        steps: list[list[str] | None] = [
            p.allow,
            provider_policy.allow if provider_policy else None,
            agent_policy.allow if agent_policy else None,
            (
                agent_policy.by_provider[provider].allow
                if agent_policy and provider in agent_policy.by_provider
                else None
            ),
            p.group_allow,
        ]
        for allow in steps:
            if allow is not None:
                tools &= self.expand(allow)
        tools -= self.expand(p.deny)
        if agent_policy:
            tools -= self.expand(agent_policy.deny)
        tools |= self.expand(p.also_allow) & all_tools
        if agent_policy:
            tools |= self.expand(agent_policy.also_allow) & all_tools
        if depth > 0:
            tools -= set(SUBAGENT_ALWAYS_DENIED)
            if depth >= max_depth:
                tools -= set(SUBAGENT_LEAF_DENIED)
        return tools
