"""API keys of the HTTP API, in PostgreSQL: only a hash of each secret is kept.

A key reads `clawq_<id>_<secret>`: the id finds the row, the secret is compared with its
SHA-256 in constant time (the secret is 256 random bits, so a fast hash is enough). A key
belongs to a user, names the agents it may run (an admin's key runs any) and may carry the
admin role; a revoked key never authenticates again.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Sequence
from datetime import datetime

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

from broker.pg.store import Store

KEY = re.compile(r"^clawq_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
USER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")  # a directory name under the root
AGENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class ApiKey(BaseModel):
    """A key as shown: never its secret."""

    id: str
    user_id: str
    admin: bool = False
    agents: list[str] = ["main"]
    name: str = ""
    created_at: datetime | None = None
    created_by: str = ""
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class ApiKeyStore:
    def __init__(self, store: Store) -> None:
        self.conn = store.conn

    def create(
        self,
        user_id: str,
        admin: bool = False,
        name: str = "",
        by: str = "",
        agents: Sequence[str] = ("main",),
    ) -> tuple[ApiKey, str]:
        """A new key; the returned string is the only time its secret exists in the clear."""
        if not USER_ID.match(user_id):
            raise ValueError(f"'{user_id}' is not a user id: letters, digits and ._@- only")
        if not agents or not all(AGENT_ID.match(a) for a in agents):
            raise ValueError("a key names the agents it may run: letters, digits and _- only")
        key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
        row = self.conn.execute(
            "INSERT INTO api_keys (id, user_id, admin, agents, name, secret_hash, created_by)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING *",
            (key_id, user_id, admin, sorted(set(agents)), name, _hash(secret), by),
        ).fetchone()
        assert row is not None
        return ApiKey.model_validate(row), f"clawq_{key_id}_{secret}"

    def list(self) -> list[ApiKey]:
        rows = self.conn.execute("SELECT * FROM api_keys ORDER BY created_at").fetchall()
        return [ApiKey.model_validate(r) for r in rows]

    def revoke(self, key_id: str) -> bool:
        done = self.conn.execute(
            "UPDATE api_keys SET revoked_at = now() WHERE id = %s AND revoked_at IS NULL",
            (key_id,),
        )
        return done.rowcount > 0


async def authenticate(pool: AsyncConnectionPool, presented: str) -> ApiKey | None:
    """The live key this string is, or None (wrong, unknown and revoked keys alike)."""
    match = KEY.match(presented.strip())
    if not match:
        return None
    key_id, secret = match.groups()
    # Only the right secret marks the key used. Comparing digests in the query leaks
    # nothing a caller could use: to match a digest's prefix is to find a hash preimage.
    async with pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            "UPDATE api_keys SET last_used_at = now()"
            " WHERE id = %s AND secret_hash = %s AND revoked_at IS NULL RETURNING *",
            (key_id, _hash(secret)),
        )
        row = await cur.fetchone()
    return None if row is None else ApiKey.model_validate(row)
