"""The canvas of a session: versioned documents the agent presents, in PostgreSQL, with a
Redis notice on every new version so live pages update at once."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from datetime import datetime
from typing import Any, Literal

import psycopg
import redis
import redis.asyncio as aioredis
from pydantic import BaseModel

from broker import keys

Format = Literal["html", "markdown"]


class CanvasVersion(BaseModel):
    session_id: str
    version: int
    format: Format
    content: str
    html: str
    created_at: datetime


def render(content: str, format: Format) -> str:
    """The HTML a version shows: as given, or Markdown with raw HTML escaped."""
    if format == "html":
        return content
    from markdown_it import MarkdownIt

    return str(MarkdownIt("commonmark", {"html": False}).enable("table").render(content))


class CanvasStore:
    def __init__(self, conn: psycopg.Connection[Any], keep: int) -> None:
        self.conn = conn
        self.keep = keep

    def current(self, session_id: str) -> CanvasVersion | None:
        row = self.conn.execute(
            "SELECT session_id, version, format, content, html, created_at FROM canvas_versions"
            " WHERE session_id = %s ORDER BY version DESC LIMIT 1",
            (session_id,),
        ).fetchone()
        return CanvasVersion.model_validate(row) if row else None

    def push(self, session_id: str, content: str, format: Format) -> CanvasVersion:
        """A new version (one statement: numbered after the last, the oldest beyond
        `keep` removed by the next push)."""
        row = self.conn.execute(
            "INSERT INTO canvas_versions (session_id, version, format, content, html)"
            " SELECT %s, coalesce(max(version), 0) + 1, %s, %s, %s FROM canvas_versions"
            " WHERE session_id = %s"
            " RETURNING session_id, version, format, content, html, created_at",
            (session_id, format, content, render(content, format), session_id),
        ).fetchone()
        version = CanvasVersion.model_validate(row)
        self.conn.execute(
            "DELETE FROM canvas_versions WHERE session_id = %s AND version <= %s",
            (session_id, version.version - self.keep),
        )
        return version


def link_key(client: redis.Redis) -> bytes:
    """The cluster's key for canvas links: made once, at random, by whoever needs it first
    (hex, so clients that decode replies read it too)."""
    client.set(keys.CANVAS_LINK_KEY, secrets.token_hex(32), nx=True)
    return _raw(client.get(keys.CANVAS_LINK_KEY))


async def link_key_async(client: aioredis.Redis) -> bytes:
    await client.set(keys.CANVAS_LINK_KEY, secrets.token_hex(32), nx=True)
    return _raw(await client.get(keys.CANVAS_LINK_KEY))


def _raw(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value or "").encode()


def _mac(key: bytes, session_id: str, expires: int) -> str:
    digest = hmac.new(key, f"canvas:{session_id}:{expires}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sign_link(key: bytes, session_id: str, ttl_s: float, now: float) -> tuple[str, int]:
    """A token that opens this session's canvas page until it expires (a time it names,
    signed with the cluster's key): for a browser, which sends no API key."""
    expires = int(now + ttl_s)
    return f"{expires}.{_mac(key, session_id, expires)}", expires


def link_opens(key: bytes, session_id: str, token: str, now: float) -> bool:
    expires, _, mac = token.partition(".")
    if not expires.isdigit() or int(expires) < now:
        return False
    return hmac.compare_digest(mac, _mac(key, session_id, int(expires)))


def announce(client: redis.Redis, version: CanvasVersion) -> None:
    client.publish(keys.canvas(version.session_id), str(version.version))
