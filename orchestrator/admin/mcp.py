"""Managing the MCP bridge from Python (and the CLI): servers, the tool catalog, grants and
access requests. `client.mcp` is one of these."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.config.mcp import Grant, McpConfigError, McpServer, parse_servers
from broker.errors import Invalid, NotFound
from broker.pg.store import Store
from broker.stores.mcp import AccessRequest, McpStore, McpToolRow, ServerState
from orchestrator.admin.definitions import read_definition


def _scope(agent: str | None, user: str | None) -> tuple[str, str]:
    if bool(agent) == bool(user):
        raise Invalid("give exactly one of agent or user", field="agent")
    return ("agent", agent) if agent else ("user", user)  # type: ignore[return-value]


class McpAdmin:
    """Every change is announced (topic `mcp`), so mcp workers reload within seconds."""

    def __init__(self, store: Store, notify: Callable[[], object] = lambda: None) -> None:
        self.store = McpStore(store)
        self.notify = notify

    def add(self, config: dict[str, Any] | str | Path) -> list[str]:
        """Add or replace servers from `mcpServers` JSON (a dict, a JSON string or a file)."""
        try:
            servers = parse_servers(read_definition(config))
        except McpConfigError as exc:
            raise Invalid(str(exc), field=exc.field) from None
        for server in servers:
            self.store.add_server(server)
        self.notify()
        return [s.name for s in servers]

    def servers(self) -> list[McpServer]:
        return self.store.servers()

    def states(self) -> dict[str, ServerState]:
        """How each server's connection fares, as the mcp workers last saw it."""
        return self.store.states()

    def remove(self, name: str) -> None:
        if not self.store.remove_server(name):
            raise NotFound(f"no MCP server '{name}'")
        self.notify()

    def tools(self) -> list[McpToolRow]:
        return self.store.catalog()

    def grant(
        self,
        server: str,
        *,
        agent: str | None = None,
        user: str | None = None,
        allow: list[str] | None = None,
        deny: list[str] | None = None,
        by: str = "",
    ) -> None:
        scope, subject = _scope(agent, user)
        self.store.grant(server, scope, subject, allow, deny, by)

    def revoke(self, server: str, *, agent: str | None = None, user: str | None = None) -> None:
        scope, subject = _scope(agent, user)
        if not self.store.revoke(server, scope, subject):
            raise NotFound(f"no grant of '{server}' to {scope} '{subject}'")

    def grants(self) -> list[Grant]:
        return self.store.all_grants()

    def request(
        self,
        server: str,
        *,
        agent: str | None = None,
        user: str | None = None,
        allow: list[str] | None = None,
        reason: str = "",
        by: str = "",
    ) -> str:
        scope, subject = _scope(agent, user)
        return self.store.request_access(server, scope, subject, allow or [], reason, by)

    def requests(self, status: str | None = "pending") -> list[AccessRequest]:
        return self.store.requests(status)

    def review(self, request_id: str, approve: bool, by: str = "") -> AccessRequest:
        return self.store.review(request_id, approve, by)
