"""MCP servers, catalog, grants and access requests on a real PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from broker.config.mcp import parse_servers
from broker.pg.store import AsyncStore, Store
from broker.stores.mcp import McpStore, McpStoreError, accessible_tools
from tests.conftest import Isolated

SCHEMA = {"type": "object", "properties": {"repo_path": {"type": "string"}}}


@pytest.fixture
def store(isolated: Isolated) -> Iterator[McpStore]:
    base = Store(isolated.database_url)
    base.migrate()
    mcp = McpStore(base)
    for server in parse_servers({"git": {"command": "mcp-server-git"}, "a": {"command": "x"}}):
        mcp.add_server(server)
    mcp.replace_tools("git", [("git_status", "Status", SCHEMA), ("git_commit", "Commit", SCHEMA)])
    yield mcp
    base.close()


def test_catalog_and_resolution(store: McpStore) -> None:
    assert [t.exposed_name for t in store.catalog()] == [
        "mcp_git__git_commit",
        "mcp_git__git_status",
    ]
    found = store.resolve("mcp_git__git_status")
    assert found and (found.server, found.tool) == ("git", "git_status")
    store.replace_tools("git", [("git_status", "Status", SCHEMA)])  # listed again: one left
    assert store.resolve("mcp_git__git_commit") is None
    store.remove_server("git")
    assert store.catalog() == []


def test_a_later_listing_settles_a_collision_the_same_way(store: McpStore) -> None:
    store.add_server(parse_servers({"git__x": {"command": "y"}})[0])
    store.replace_tools("a", [("git__x__t", "", SCHEMA)])  # mcp_a__git__x__t
    store.replace_tools("git__x", [("t", "", SCHEMA)])  # mcp_git__x__t: no clash
    store.replace_tools("git", [("x__t", "", SCHEMA)])  # mcp_git__x__t: clashes, sorts first
    names = {(t.server, t.tool): t.exposed_name for t in store.catalog()}
    assert names[("git", "x__t")] == "mcp_git__x__t"
    assert names[("git__x", "t")] == "mcp_git__x__t_2"


def test_grants_filter_what_an_agent_or_user_may_use(store: McpStore, isolated: Isolated) -> None:
    store.grant("git", "agent", "main", deny=["git_commit"], by="admin")
    store.grant("git", "user", "ann", allow=["git_commit"], by="admin")
    with pytest.raises(McpStoreError, match="no MCP server 'nope'"):
        store.grant("nope", "agent", "main")

    async def usable(agent: str, user: str) -> list[str]:
        pool = AsyncStore(isolated.database_url)
        await pool.open()
        try:
            return [t.exposed_name for t in await accessible_tools(pool.pool, agent, user)]
        finally:
            await pool.close()

    assert asyncio.run(usable("main", "")) == ["mcp_git__git_status"]
    assert asyncio.run(usable("main", "ann")) == ["mcp_git__git_status"]  # deny wins
    assert asyncio.run(usable("other", "ann")) == ["mcp_git__git_commit"]
    assert asyncio.run(usable("other", "bob")) == []
    assert store.revoke("git", "agent", "main") and not store.revoke("git", "agent", "main")


def test_access_requests_become_grants_when_approved(store: McpStore) -> None:
    asked = store.request_access("git", "agent", "coder", ["git_status"], "to read", by="ann")
    assert [r.id for r in store.requests()] == [asked]
    assert store.grants("coder", "") == []
    done = store.review(asked, approve=True, by="admin")
    assert done.status == "approved" and done.reviewed_by == "admin"
    (grant,) = store.grants("coder", "")
    assert (grant.server, grant.scope, grant.tool_allow) == ("git", "agent", ["git_status"])
    assert store.requests() == []
    with pytest.raises(McpStoreError, match="no pending access request"):
        store.review(asked, approve=False, by="admin")  # reviewed once only

    rejected = store.request_access("git", "user", "eve", [], "", by="eve")
    assert store.review(rejected, approve=False, by="admin").status == "rejected"
    assert store.grants("", "eve") == []
    assert {r.status for r in store.requests(None)} == {"approved", "rejected"}
