"""Managing the MCP bridge from Python (and the CLI): servers, the tool catalog, grants and
access requests. `client.mcp` is one of these."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.config.mcp import Grant, McpConfigError, McpServer, parse_servers
from broker.config.settings import Settings
from broker.errors import Invalid, NotFound
from broker.pg.store import Store
from broker.stores.mcp import AccessRequest, McpStore, McpToolRow, ServerState, ServerStatus
from orchestrator.admin.definitions import read_definition
from orchestrator.admin.mcp_login import LoginStart, begin, finish


def _scope(agent: str | None, user: str | None) -> tuple[str, str]:
    if bool(agent) == bool(user):
        raise Invalid("give exactly one of agent or user", field="agent")
    return ("agent", agent) if agent else ("user", user)  # type: ignore[return-value]


class McpAdmin:
    """Every change is announced (topic `mcp`), so mcp workers reload within seconds."""

    def __init__(
        self,
        store: Store,
        notify: Callable[[], object] = lambda: None,
        settings: Settings | None = None,
    ) -> None:
        self.store = McpStore(store)
        self.pg = store
        self.notify = notify
        self.settings = settings or Settings()

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

    def status(self) -> list[ServerStatus]:
        """Each server with its negotiated protocol version and where its OAuth stands."""
        return self.store.status()

    def prompt(self, server: str, name: str) -> str:
        """A server's prompt that takes no arguments, as the workers last rendered it: a
        job's system prompt (`clawq run --mcp-prompt server:name`)."""
        facts = self.store.facts().get(server)
        if facts is None:
            raise NotFound(f"no MCP server '{server}' listed by an mcp worker yet")
        found = {p["name"]: p for p in facts.get("prompts", [])}
        if name not in found:
            raise NotFound(
                f"MCP server '{server}' has no prompt '{name}' (has: {', '.join(found)})"
            )
        needed = [a["name"] for a in found[name]["arguments"] if a["required"]]
        if needed or "text" not in found[name]:
            raise Invalid(
                f"prompt '{name}' of '{server}' needs arguments ({', '.join(needed)}): a job "
                "gets it with the get_prompt tool instead"
            )
        return str(found[name]["text"])

    def login_start(self, name: str, redirect_uri: str) -> LoginStart:
        """A person's OAuth login: the URL to open (authorization code with PKCE); the
        authorization server sends the code and `state` to `redirect_uri`."""
        server = self.store.server(name)
        if server is None:
            raise NotFound(f"no MCP server '{name}'")
        return begin(self.settings, server, redirect_uri)

    def login_finish(self, state: str, code: str) -> str:
        """The code came back: tokens are fetched and kept (sealed); returns the server."""
        name = finish(self.settings, self.pg, state, code)
        self.notify()
        return name

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
