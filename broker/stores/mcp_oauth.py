"""The OAuth grants of MCP servers in PostgreSQL, sealed with the secret box.

A grant (the client, its tokens, the token endpoint) is sealed whole, tied to its server
and subject (a sealed grant moved to another row does not open). Each refresh stores the
new grant with its version bumped, in the same statement that checks the version it
replaced, so a rotated refresh token is saved before anyone uses the access token that
came with it. A grant the authorization server refused is kept with its status, for
`clawq mcp list` to say so and what to do.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from broker.config.secretbox import SecretBox
from broker.pg.store import Store

Status = Literal["ok", "revoked", "failed"]


class OAuthGrant(BaseModel):
    """What a server's OAuth needs at run time; all of it is sealed."""

    token_endpoint: str
    client_id: str
    client_secret: str = ""
    auth_method: str = "client_secret_post"  # or "none" (a public client), client_secret_basic
    scope: str = ""
    resource: str = ""  # RFC 8707: the MCP server the tokens are for
    access_token: str = ""
    refresh_token: str = ""
    expires_at: float | None = None  # epoch seconds


class StoredGrant(BaseModel):
    grant: OAuthGrant
    status: Status
    detail: str
    version: int


def _associated(server: str, subject: str) -> bytes:
    return f"mcp-oauth\0{server}\0{subject}".encode()


class McpOAuthStore:
    def __init__(self, store: Store, box: SecretBox) -> None:
        self.conn = store.conn
        self.box = box

    def load(self, server: str, subject: str = "") -> StoredGrant | None:
        row = self.conn.execute(
            "SELECT sealed, status, detail, version FROM mcp_oauth"
            " WHERE server = %s AND subject = %s",
            (server, subject),
        ).fetchone()
        if row is None:
            return None
        opened = self.box.open(row["sealed"], _associated(server, subject))
        return StoredGrant(
            grant=OAuthGrant.model_validate_json(opened),
            status=row["status"],
            detail=row["detail"],
            version=row["version"],
        )

    def save(
        self, server: str, grant: OAuthGrant, subject: str = "", replaces: int | None = None
    ) -> int | None:
        """Store `grant` (status ok); with `replaces`, only over that version (else None:
        someone else stored a newer one first). Returns the new version."""
        sealed = self.box.seal(grant.model_dump_json().encode(), _associated(server, subject))
        if replaces is None:
            row = self.conn.execute(
                "INSERT INTO mcp_oauth (server, subject, sealed, expires_at)"
                " VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (server, subject) DO UPDATE SET sealed = excluded.sealed,"
                " expires_at = excluded.expires_at, status = 'ok', detail = '',"
                " version = mcp_oauth.version + 1, updated_at = now() RETURNING version",
                (server, subject, sealed, grant.expires_at),
            ).fetchone()
        else:
            row = self.conn.execute(
                "UPDATE mcp_oauth SET sealed = %s, expires_at = %s, status = 'ok', detail = '',"
                " version = version + 1, updated_at = now()"
                " WHERE server = %s AND subject = %s AND version = %s RETURNING version",
                (sealed, grant.expires_at, server, subject, replaces),
            ).fetchone()
        return None if row is None else int(row["version"])

    def mark(self, server: str, status: Status, detail: str, subject: str = "") -> None:
        """The authorization server refused the grant (`revoked`) or could not be used."""
        self.conn.execute(
            "UPDATE mcp_oauth SET status = %s, detail = %s, updated_at = now()"
            " WHERE server = %s AND subject = %s",
            (status, detail[:300], server, subject),
        )
