"""The canvas of a session: versioned documents the agent presents, in PostgreSQL, with a
Redis notice on every new version so live pages update at once."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import psycopg
import redis
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


def announce(client: redis.Redis, version: CanvasVersion) -> None:
    client.publish(keys.canvas(version.session_id), str(version.version))
