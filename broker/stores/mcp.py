"""MCP servers, their tool catalog, grants and access requests in PostgreSQL.

`McpStore` is synchronous (CLI, client, workers); `accessible_tools` serves orchestrators.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

from broker.config.mcp import Grant, McpServer, exposed_names, granted
from broker.errors import Conflict, Invalid
from broker.pg.store import Store
from broker.redis.batching import SharedReads

CATALOG_LOCK = 7_415_922_002
_reads = SharedReads()


class McpStoreError(Invalid):
    """Bad input for the MCP store; the message says what to change."""


class NotPending(Conflict, McpStoreError):
    """An access request that is not (or no longer) waiting for a review."""


class McpToolRow(BaseModel):
    """One tool of the catalog, as the model is shown it."""

    server: str
    tool: str
    exposed_name: str
    description: str
    input_schema: dict[str, Any]
    total_timeout_s: float | None = None  # the server's own limit, when it has one


class ServerStatus(BaseModel):
    """A server as `clawq mcp list` shows it: no secrets, the protocol version the workers
    negotiated, and where its OAuth grant stands (with the fix when it needs one)."""

    name: str
    transport: str
    target: str
    enabled: bool
    state: str = ""  # connected, retrying, failed; '': no mcp worker has tried it yet
    last_error: str = ""
    protocol_version: str = ""
    auth: str = ""


def _auth(server: McpServer, status: str | None, detail: str | None) -> str:
    if server.oauth is None:
        return ""
    fix = f"run `clawq mcp login {server.name}`"
    if status is None:
        return "login needed: " + fix if server.oauth.grant == "authorization_code" else ""
    if status == "ok":
        return "ok"
    return f"{status} ({detail}): {fix}" if detail else f"{status}: {fix}"


class ServerState(BaseModel):
    """A server's connection as the mcp workers last saw it ('' state: not tried yet)."""

    state: str
    last_error: str
    state_at: datetime | None


class AccessRequest(BaseModel):
    id: str
    server: str
    scope: str
    subject: str
    tool_allow: list[str]
    reason: str
    status: str
    requested_by: str
    reviewed_by: str


SELECT_GRANTS = (
    "SELECT server, scope, subject, tool_allow, tool_deny, enabled FROM mcp_grants"
    " WHERE (scope = 'agent' AND subject = %s) OR (scope = 'user' AND subject = %s)"
)
COLUMNS = (
    "t.server, t.tool, t.exposed_name, t.description, t.input_schema,"
    " (s.config->>'total_timeout_s')::float AS total_timeout_s"
)
SELECT_CATALOG = (
    f"SELECT {COLUMNS} FROM mcp_tools t"
    " JOIN mcp_servers s ON s.name = t.server WHERE s.enabled ORDER BY t.exposed_name"
)
UPSERT_GRANT = (
    "INSERT INTO mcp_grants (server, scope, subject, tool_allow, tool_deny, enabled, granted_by)"
    " VALUES (%s, %s, %s, %s, %s, true, %s) ON CONFLICT (server, scope, subject) DO UPDATE SET"
    " tool_allow = excluded.tool_allow, tool_deny = excluded.tool_deny, enabled = true,"
    " granted_by = excluded.granted_by"
)


def usable(rows: list[McpToolRow], grants: list[Grant]) -> list[McpToolRow]:
    return [r for r in rows if granted(grants, r.server, r.tool)]


class McpStore:
    def __init__(self, store: Store) -> None:
        self.conn = store.conn  # rows come back as dicts

    # -- servers and their catalog ---------------------------------------------------------

    def add_server(self, server: McpServer) -> None:
        self.conn.execute(
            "INSERT INTO mcp_servers (name, config, enabled) VALUES (%s, %s, %s)"
            " ON CONFLICT (name) DO UPDATE SET config = excluded.config,"
            " enabled = excluded.enabled, updated_at = now(), state = '', last_error = ''",
            (server.name, Jsonb(server.model_dump(by_alias=True)), server.enabled),
        )

    def remove_server(self, name: str) -> bool:
        cur = self.conn.execute("DELETE FROM mcp_servers WHERE name = %s", (name,))
        return cur.rowcount > 0

    def servers(self, enabled_only: bool = False) -> list[McpServer]:
        sql = "SELECT config, enabled FROM mcp_servers"
        if enabled_only:
            sql += " WHERE enabled"
        rows = self.conn.execute(sql + " ORDER BY name").fetchall()
        return [McpServer.model_validate({**r["config"], "enabled": r["enabled"]}) for r in rows]

    def server(self, name: str) -> McpServer | None:
        row = self.conn.execute(
            "SELECT config, enabled FROM mcp_servers WHERE name = %s", (name,)
        ).fetchone()
        if row is None:
            return None
        found = row
        return McpServer.model_validate({**found["config"], "enabled": found["enabled"]})

    def set_state(self, server: str, state: str, error: str = "") -> None:
        """How the server's connection fares (a worker's view): connected, retrying, failed."""
        self.conn.execute(
            "UPDATE mcp_servers SET state = %s, last_error = %s, state_at = now() WHERE name = %s",
            (state, error[:500], server),
        )

    def states(self) -> dict[str, ServerState]:
        rows = self.conn.execute("SELECT name, state, last_error, state_at FROM mcp_servers")
        return {r["name"]: ServerState.model_validate(r) for r in rows.fetchall()}

    def replace_tools(self, server: str, tools: list[tuple[str, str, dict[str, Any]]]) -> None:
        """A server's tools as it just listed them (name, description, input schema). Names
        of every server are derived again together, so a collision is settled the same way
        whoever lists first."""
        with self.conn.transaction():
            self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (CATALOG_LOCK,))
            if not self.conn.execute(
                "SELECT 1 FROM mcp_servers WHERE name = %s", (server,)
            ).fetchone():
                return  # removed meanwhile
            others = self.conn.execute(
                "SELECT server, tool FROM mcp_tools WHERE server <> %s", (server,)
            ).fetchall()
            pairs = [(r["server"], r["tool"]) for r in others]
            pairs += [(server, name) for name, _, _ in tools]
            names = exposed_names(pairs)
            self.conn.execute("DELETE FROM mcp_tools WHERE server = %s", (server,))
            for (srv, tool), exposed in names.items():
                if srv != server:
                    self.conn.execute(
                        "UPDATE mcp_tools SET exposed_name = %s WHERE server = %s AND tool = %s"
                        " AND exposed_name <> %s",
                        (exposed, srv, tool, exposed),
                    )
            for name, description, schema in tools:
                self.conn.execute(
                    "INSERT INTO mcp_tools (server, tool, exposed_name, description, input_schema)"
                    " VALUES (%s, %s, %s, %s, %s)",
                    (server, name, names[(server, name)], description, Jsonb(schema)),
                )

    def set_facts(self, server: str, facts: dict[str, Any]) -> None:
        """What the server said when last listed (protocol version, prompts, templates)."""
        self.conn.execute(
            "INSERT INTO mcp_server_facts (server, facts) SELECT name, %s FROM mcp_servers"
            " WHERE name = %s ON CONFLICT (server) DO UPDATE SET facts = excluded.facts,"
            " listed_at = now()",
            (Jsonb(facts), server),
        )

    def status(self) -> list[ServerStatus]:
        rows = self.conn.execute(
            "SELECT s.config, s.enabled, s.state, s.last_error, f.facts, o.status, o.detail"
            " FROM mcp_servers s"
            " LEFT JOIN mcp_server_facts f ON f.server = s.name"
            " LEFT JOIN mcp_oauth o ON o.server = s.name AND o.subject = ''"
            " ORDER BY s.name"
        ).fetchall()
        out = []
        for r in rows:
            s = McpServer.model_validate({**r["config"], "enabled": r["enabled"]})
            target = " ".join([s.command, *s.args]) if s.transport == "stdio" else s.url
            out.append(
                ServerStatus(
                    name=s.name,
                    transport=s.transport,
                    target=target,
                    enabled=s.enabled,
                    state=r["state"],
                    last_error=r["last_error"],
                    protocol_version=(r["facts"] or {}).get("protocol_version", ""),
                    auth=_auth(s, r["status"], r["detail"]),
                )
            )
        return out

    def facts(self) -> dict[str, dict[str, Any]]:
        rows = self.conn.execute("SELECT server, facts FROM mcp_server_facts").fetchall()
        return {r["server"]: r["facts"] for r in rows}

    def catalog(self) -> list[McpToolRow]:
        rows = self.conn.execute(SELECT_CATALOG).fetchall()
        return [McpToolRow.model_validate(r) for r in rows]

    def resolve(self, exposed: str) -> McpToolRow | None:
        """Exposed name → (server, tool): looked up, never parsed."""
        row = self.conn.execute(
            f"SELECT {COLUMNS} FROM mcp_tools t JOIN mcp_servers s ON s.name = t.server"
            " WHERE t.exposed_name = %s AND s.enabled",
            (exposed,),
        ).fetchone()
        return McpToolRow.model_validate(row) if row else None

    # -- grants ----------------------------------------------------------------------------

    def grant(
        self,
        server: str,
        scope: str,
        subject: str,
        allow: list[str] | None = None,
        deny: list[str] | None = None,
        by: str = "",
    ) -> None:
        if self.server(server) is None:
            raise McpStoreError(f"no MCP server '{server}'")
        self.conn.execute(
            UPSERT_GRANT, (server, scope, subject, Jsonb(allow or []), Jsonb(deny or []), by)
        )

    def revoke(self, server: str, scope: str, subject: str) -> bool:
        cur = self.conn.execute(
            "DELETE FROM mcp_grants WHERE server = %s AND scope = %s AND subject = %s",
            (server, scope, subject),
        )
        return cur.rowcount > 0

    def grants(self, agent: str, user: str) -> list[Grant]:
        rows = self.conn.execute(SELECT_GRANTS, (agent, user)).fetchall()
        return [Grant.model_validate(r) for r in rows]

    def all_grants(self) -> list[Grant]:
        rows = self.conn.execute(
            "SELECT server, scope, subject, tool_allow, tool_deny, enabled FROM mcp_grants"
            " ORDER BY server, scope, subject"
        ).fetchall()
        return [Grant.model_validate(r) for r in rows]

    # -- access requests -------------------------------------------------------------------

    def request_access(
        self, server: str, scope: str, subject: str, allow: list[str], reason: str, by: str
    ) -> str:
        if self.server(server) is None:
            raise McpStoreError(f"no MCP server '{server}'")
        request_id = uuid.uuid4().hex[:12]
        self.conn.execute(
            "INSERT INTO mcp_access_requests"
            " (id, server, scope, subject, tool_allow, reason, requested_by)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (request_id, server, scope, subject, Jsonb(allow), reason, by),
        )
        return request_id

    def requests(self, status: str | None = "pending") -> list[AccessRequest]:
        sql = "SELECT * FROM mcp_access_requests"
        params: tuple[Any, ...] = ()
        if status:
            sql += " WHERE status = %s"
            params = (status,)
        rows = self.conn.execute(sql + " ORDER BY created_at", params).fetchall()
        return [AccessRequest.model_validate(r) for r in rows]

    def review(self, request_id: str, approve: bool, by: str) -> AccessRequest:
        """Approve (the grant is created in the same transaction) or reject a pending one."""
        with self.conn.transaction():
            row = self.conn.execute(
                "UPDATE mcp_access_requests SET status = %s, reviewed_by = %s,"
                " reviewed_at = now() WHERE id = %s AND status = 'pending' RETURNING *",
                ("approved" if approve else "rejected", by, request_id),
            ).fetchone()
            if row is None:
                raise NotPending(f"no pending access request '{request_id}'")
            request = AccessRequest.model_validate(row)
            if approve:
                self.conn.execute(
                    UPSERT_GRANT,
                    (
                        request.server,
                        request.scope,
                        request.subject,
                        Jsonb(request.tool_allow),
                        Jsonb([]),
                        by,
                    ),
                )
        return request


async def catalog_entry(pool: AsyncConnectionPool, exposed: str) -> McpToolRow | None:
    """The catalog's tool of this exposed name, granted or not."""
    async with pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            "SELECT t.server, t.tool, t.exposed_name, t.description, t.input_schema"
            " FROM mcp_tools t JOIN mcp_servers s ON s.name = t.server"
            " WHERE s.enabled AND t.exposed_name = %s",
            (exposed,),
        )
        row = await cur.fetchone()
    return McpToolRow.model_validate(row) if row else None


async def accessible_tools(pool: AsyncConnectionPool, agent: str, user: str) -> list[McpToolRow]:
    """The catalog's tools this agent and user may use (grants applied); shared with the
    jobs of the same agent and user that start in the same pass of the loop (read-only)."""
    return await _reads.read((pool, agent, user), lambda: _accessible(pool, agent, user))


async def _accessible(pool: AsyncConnectionPool, agent: str, user: str) -> list[McpToolRow]:
    async with pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(SELECT_GRANTS, (agent, user))
        grants = [Grant.model_validate(r) for r in await cur.fetchall()]
        if not grants:
            return []
        await cur.execute(SELECT_CATALOG)
        rows = [McpToolRow.model_validate(r) for r in await cur.fetchall()]
    return usable(rows, grants)
