"""MCP configuration as data: the mcpServers JSON other clients write, exposed names, grants."""

from __future__ import annotations

import pytest

from broker.config.mcp import (
    Grant,
    McpConfigError,
    exposed_name,
    exposed_names,
    granted,
    parse_servers,
)


def test_mcp_servers_json_as_other_clients_write_it() -> None:
    servers = parse_servers(
        {
            "mcpServers": {
                "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
                "remote": {"type": "http", "url": "https://example.com/mcp", "headers": {"A": "b"}},
                "legacy": {"type": "sse", "url": "http://localhost:9000/sse"},
                "bare": {"url": "http://localhost:9001/mcp"},
            }
        }
    )
    by_name = {s.name: s for s in servers}
    assert by_name["time"].transport == "stdio" and by_name["time"].args == ["mcp-server-time"]
    assert by_name["remote"].transport == "streamable-http"
    assert by_name["legacy"].transport == "sse"
    assert by_name["bare"].transport == "streamable-http"  # a url without a type
    assert by_name["remote"].public()["headers"] == {"A": "***"}  # secrets are not shown
    assert parse_servers({"solo": {"command": "x"}})[0].name == "solo"  # the inner mapping


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"mcpServers": {}}, "expected"),
        ({"mcpServers": {"a b": {"command": "x"}}}, "mcpServers.a b: Value error, server name"),
        ({"mcpServers": {"s": {"type": "stdio"}}}, "a stdio server needs a command"),
        ({"mcpServers": {"s": {"type": "sse", "url": "ftp://x"}}}, "needs an http(s) url"),
        ({"mcpServers": {"s": {"type": "carrier-pigeon", "url": "http://x"}}}, "mcpServers.s.type"),
        ({"mcpServers": {"s": "uvx"}}, "mcpServers.s: expected an object"),
    ],
)
def test_bad_configuration_says_where(raw: object, message: str) -> None:
    with pytest.raises(McpConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_servers(raw)


def test_exposed_names_are_valid_and_stable() -> None:
    assert exposed_name("git", "git_status") == "mcp_git__git_status"  # unchanged: no suffix
    changed = exposed_name("my.server", "do thing")
    assert changed == "mcp_my_server__do_thing_a8a602a3"  # sha256, the same in every process
    long = exposed_name("s" * 40, "t" * 60)
    assert len(long) == 64 and long.endswith("_" + long[-8:])
    assert exposed_name("s" * 40, "t" * 60) != exposed_name("s" * 40, "t" * 61)


def test_collisions_are_settled_in_sorted_order() -> None:
    pairs = [("a", "b__c"), ("a__b", "c")]  # both would be mcp_a__b__c
    names = exposed_names(pairs)
    assert names[("a", "b__c")] == "mcp_a__b__c"
    assert names[("a__b", "c")] == "mcp_a__b__c_2"
    assert exposed_names(list(reversed(pairs))) == names


def test_grants_deny_wins_and_empty_allow_means_all() -> None:
    agent = Grant(server="git", scope="agent", subject="main", tool_deny=["git_commit"])
    user = Grant(server="git", scope="user", subject="ann", tool_allow=["git_commit", "git_log"])
    assert granted([agent], "git", "git_status")
    assert not granted([agent, user], "git", "git_commit")  # denied by one grant: denied
    assert granted([user], "git", "git_log") and not granted([user], "git", "git_status")
    assert not granted([agent], "time", "get_current_time")  # no grant on that server
    off = agent.model_copy(update={"enabled": False})
    assert not granted([off], "git", "git_status")


def test_a_servers_limits_are_its_own_under_the_settings_ceiling() -> None:
    from broker.config.settings import Settings

    settings = Settings(mcp_call_timeout_s=60, mcp_call_total_s=600)
    (plain, own, greedy) = parse_servers(
        {
            "plain": {"command": "x"},
            "own": {"command": "x", "idle_timeout_s": 5, "total_timeout_s": 30},
            "greedy": {"command": "x", "idle_timeout_s": 9000, "total_timeout_s": 9000},
        }
    )
    assert plain.limits(settings) == (60, 600)
    assert own.limits(settings) == (5, 30)
    assert greedy.limits(settings) == (600, 600)  # never past the task's time limit


def test_oauth_is_for_http_servers_and_a_service_account_names_its_client() -> None:
    with pytest.raises(McpConfigError, match="OAuth is for servers over HTTP"):
        parse_servers({"s": {"command": "x", "oauth": {}}})
    with pytest.raises(McpConfigError, match="client_credentials needs a client_id"):
        parse_servers({"s": {"url": "https://h/mcp", "oauth": {"grant": "client_credentials"}}})
    (server,) = parse_servers(
        {"s": {"url": "https://h/mcp", "oauth": {"client_id": "c", "client_secret": "shh"}}}
    )
    assert server.public()["oauth"] == {
        "grant": "authorization_code",
        "client_id": "c",
        "client_secret": "***",
        "scope": "",
    }


def test_the_built_ins_are_named_as_the_model_expects() -> None:
    assert exposed_name("docs", "resources/read") == "mcp_docs__read_resource"
    assert exposed_name("docs", "prompts/get") == "mcp_docs__get_prompt"
    names = exposed_names([("docs", "list_resources"), ("docs", "resources/list")])
    assert names[("docs", "list_resources")] == "mcp_docs__list_resources"  # the server's own
    assert names[("docs", "resources/list")] == "mcp_docs__list_resources_2"


def test_other_clients_keys_are_taken_and_a_typo_refused() -> None:
    """A config pasted from Cline or Claude Desktop works; `argz` is refused by name."""
    (server,) = parse_servers(
        {"mcpServers": {"t": {"command": "x", "autoApprove": ["a"], "disabled": True}}}
    )
    assert server.command == "x" and not server.enabled
    with pytest.raises(McpConfigError, match=r"^mcpServers\.t\.argz: Extra inputs") as found:
        parse_servers({"mcpServers": {"t": {"command": "x", "argz": ["-v"]}}})
    assert found.value.field == "mcpServers.t.argz"
