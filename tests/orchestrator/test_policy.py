"""The policy engine's 7-step pipeline, deny, alsoAllow and subagent lists."""

from __future__ import annotations

from typing import Any

import pytest

from broker.config.policy import ToolPolicy
from broker.protocol import Group
from orchestrator.calls.policy import PolicyEngine, PolicyError
from workers.registry import Registry, default_registry
from workers.tool import Tool, ToolInput

FS = {"read_file", "write_file", "edit_file", "list_files", "search", "glob"}


def make_tool(name: str, group: Group) -> type[Tool[Any]]:
    return type(
        name, (Tool,), {"name": name, "description": name, "group": group, "input_model": ToolInput}
    )


def registry() -> Registry:
    return default_registry()


def visible(policy: dict[str, Any], **kwargs: Any) -> set[str]:
    return PolicyEngine(registry(), ToolPolicy.model_validate(policy)).visible(**kwargs)


ALL = FS | {
    "exec",
    "process",
    "session_status",
    "sessions_list",
    "sessions_history",
    "read_result",
    "sessions_spawn",
    "spawn",
    "subagents",
    "sessions_send",
    "message",
    "ask_user",
    "web_fetch",
    "web_search",
    "memory_search",
    "memory_get",
    "browser",
    "canvas",
    "cron",
    "gateway",
    "nodes",
    "tts",
    "image",
    "skill_search",
}
MEMORY = {"memory_search", "memory_get"}
NEVER_FOR_SUBAGENTS = MEMORY | {"cron", "gateway"}  # the seed's always-denied list


@pytest.mark.parametrize(
    ("policy", "kwargs", "expected"),
    [
        ({}, {}, ALL),
        (
            {"profile": "coding"},
            {},
            FS
            | {
                "exec",
                "process",
                "session_status",
                "sessions_list",
                "sessions_history",
                "read_result",
                "sessions_spawn",
                "spawn",
                "subagents",
                "sessions_send",
                "nodes",
                "image",  # the seed's coding profile names it
                "ask_user",
            }
            | MEMORY,
        ),
        (
            {"profile": "messaging"},
            {},
            {
                "message",
                "ask_user",
                "sessions_send",
                "session_status",
                "sessions_list",
                "sessions_history",
            },
        ),
        ({"profile": "minimal"}, {}, {"session_status"}),
        (
            {"byProvider": {"openai": {"profile": "minimal"}}},
            {"provider": "openai"},
            {"session_status"},
        ),
        ({"byProvider": {"openai": {"profile": "minimal"}}}, {"provider": "anthropic"}, ALL),
        ({"allow": ["group:fs", "exec"]}, {}, FS | {"exec"}),
        (
            {"allow": ["group:fs", "exec"], "byProvider": {"openai": {"allow": ["group:runtime"]}}},
            {"provider": "openai"},
            {"exec"},
        ),
        (
            {"agents": {"coder": {"allow": ["read_file", "exec"]}}},
            {"agent": "coder"},
            {"read_file", "exec"},
        ),
        (
            {"agents": {"coder": {"byProvider": {"openai": {"allow": ["exec"]}}}}},
            {"agent": "coder", "provider": "openai"},
            {"exec"},
        ),
        ({"groupAllow": ["group:fs"]}, {}, FS),
        ({"deny": ["group:fs"]}, {}, ALL - FS),
        ({"agents": {"a": {"deny": ["exec"]}}}, {"agent": "a"}, ALL - {"exec"}),
        ({"allow": ["read_file"], "alsoAllow": ["exec", "not_a_tool"]}, {}, {"read_file", "exec"}),
        ({"deny": ["exec"], "alsoAllow": ["exec"]}, {}, ALL),  # alsoAllow comes after deny
        ({"allow": ["group:goclaw"]}, {}, ALL),
        (
            {},
            {"depth": 1, "max_depth": 2},
            ALL - {"session_status", "sessions_send"} - NEVER_FOR_SUBAGENTS,
        ),
        (
            {},
            {"depth": 1, "max_depth": 1},
            ALL
            - {
                "session_status",
                "sessions_send",
                "sessions_spawn",
                "spawn",
                "subagents",
                "sessions_list",
                "sessions_history",
            }
            - NEVER_FOR_SUBAGENTS,
        ),
    ],
)
def test_pipeline(policy: dict[str, Any], kwargs: dict[str, Any], expected: set[str]) -> None:
    assert visible(policy, **kwargs) == expected


@pytest.mark.parametrize(
    "policy",
    [
        {"profile": "everything"},
        {"allow": ["group:nope"]},
        {"deny": ["group:filesystem"]},
        {"byProvider": {"openai": {"profile": "bogus"}}},
        {"agents": {"a": {"alsoAllow": ["group:x"]}}},
    ],
)
def test_unknown_profiles_and_groups_fail_closed(policy: dict[str, Any]) -> None:
    with pytest.raises(PolicyError):
        PolicyEngine(registry(), ToolPolicy.model_validate(policy))


def test_mcp_groups_are_dynamic() -> None:
    from broker.stores.mcp import McpToolRow
    from workers.tools.mcp.tool import tool_class

    schema = {"type": "object", "properties": {}}
    rows = [
        McpToolRow(
            server=s, tool=t, exposed_name=f"mcp_{s}__{t}", description="d", input_schema=schema
        )
        for s, t in [("time", "now"), ("git", "status")]
    ]
    reg = default_registry().extended(tool_class(r, 60) for r in rows)
    engine = PolicyEngine(reg, ToolPolicy.model_validate({"deny": ["group:mcp:git"]}))
    seen = engine.visible()
    assert "mcp_time__now" in seen and "mcp_git__status" not in seen
    allow_mcp = PolicyEngine(reg, ToolPolicy.model_validate({"allow": ["group:mcp"]}))
    assert allow_mcp.visible() == {"mcp_time__now", "mcp_git__status"}
    assert "mcp_time__now" not in PolicyEngine(reg, ToolPolicy()).groups["goclaw"]
    # a server not (yet) listed is no configuration error: its group is empty
    quiet = PolicyEngine(default_registry(), ToolPolicy.model_validate({"allow": ["group:mcp:x"]}))
    assert quiet.visible() == set()


def test_one_engine_answers_each_agent_provider_and_depth_as_a_new_one_would() -> None:
    """The engine keeps what it worked out per agent, provider and depth (shared by their
    jobs): asking in any order gives what a fresh engine gives."""
    policy = {
        "byProvider": {"openai": {"allow": ["group:fs"]}},
        "agents": {"a": {"deny": ["exec"]}},
    }
    asks: list[dict[str, Any]] = [
        {},
        {"agent": "a"},
        {"provider": "openai"},
        {"agent": "a", "provider": "openai"},
        {"depth": 1, "max_depth": 2},
        {"depth": 1, "max_depth": 1},
        {},
    ]
    engine = PolicyEngine(registry(), ToolPolicy.model_validate(policy))
    answers = [set(engine.visible(**kwargs)) for kwargs in asks]
    assert answers == [visible(policy, **kwargs) for kwargs in asks]
    assert len({frozenset(a) for a in answers}) == 5  # the cases differ
