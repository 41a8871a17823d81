"""Context files (SOUL.md, IDENTITY.md, …) in PostgreSQL, per agent and per user.

A row with user_id '' is the agent's own copy. Every write names the version it expects
(0: that the file does not exist), so two writers never overwrite each other silently:
the second gets `VersionConflict` and reads again."""

from __future__ import annotations

from typing import Any, Literal

import psycopg
from pydantic import BaseModel

from broker.errors import Conflict

CONTEXT_FILES = (
    "AGENTS.md",
    "SOUL.md",
    "TOOLS.md",
    "IDENTITY.md",
    "USER.md",
    "HEARTBEAT.md",
    "BOOTSTRAP.md",
)
PER_USER_WHEN_PREDEFINED = frozenset({"USER.md", "BOOTSTRAP.md"})

AgentKind = Literal["open", "predefined"]
# the names of the files the agent and a user (agent_id, user_id) have: a listing reads no
# content
NAMES_SQL = (
    "SELECT DISTINCT name FROM context_files WHERE agent_id = %s AND user_id IN (%s, '')"
    " ORDER BY name"
)


class VersionConflict(Conflict):
    """The document changed since the writer read it."""

    def __init__(self, name: str, current: int) -> None:
        super().__init__(f"{name} changed since it was read: it is at version {current}")
        self.name = name
        self.current = current


class ContextFile(BaseModel):
    agent_id: str
    user_id: str
    name: str
    content: str
    version: int


class ContextFileStore:
    """Reads and version-checked writes of context files on one connection."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def kind(self, agent_id: str) -> AgentKind:
        row = self.conn.execute("SELECT kind FROM agents WHERE id = %s", (agent_id,)).fetchone()
        return "predefined" if row and row["kind"] == "predefined" else "open"

    def set_kind(self, agent_id: str, kind: AgentKind) -> None:
        self.conn.execute(
            "INSERT INTO agents (id, kind) VALUES (%s, %s)"
            " ON CONFLICT (id) DO UPDATE SET kind = excluded.kind",
            (agent_id, kind),
        )

    def get(self, agent_id: str, user_id: str, name: str) -> ContextFile | None:
        row = self.conn.execute(
            "SELECT agent_id, user_id, name, content, version FROM context_files"
            " WHERE agent_id = %s AND user_id = %s AND name = %s",
            (agent_id, user_id, name),
        ).fetchone()
        return ContextFile.model_validate(row) if row else None

    def version(self, agent_id: str, user_id: str, name: str) -> int:
        row = self.conn.execute(
            "SELECT version FROM context_files WHERE agent_id = %s AND user_id = %s AND name = %s",
            (agent_id, user_id, name),
        ).fetchone()
        return int(row["version"]) if row else 0

    def put(self, agent_id: str, user_id: str, name: str, content: str, expected: int) -> int:
        """Write the file if its version is still `expected`; returns the new version."""
        with self.conn.transaction():
            current = self._locked_version(agent_id, user_id, name)
            if current != expected:
                raise VersionConflict(name, current)
            row = self.conn.execute(
                "INSERT INTO context_files (agent_id, user_id, name, content)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (agent_id, user_id, name) DO UPDATE"
                " SET content = excluded.content, version = nextval('document_versions'),"
                " updated_at = now() RETURNING version",
                (agent_id, user_id, name, content),
            ).fetchone()
        assert row is not None
        return int(row["version"])

    def delete(self, agent_id: str, user_id: str, name: str, expected: int | None = None) -> bool:
        """Remove the file (when still at `expected`, if given); whether there was one."""
        with self.conn.transaction():
            current = self._locked_version(agent_id, user_id, name)
            if expected is not None and current != expected:
                raise VersionConflict(name, current)
            self.conn.execute(
                "DELETE FROM context_files WHERE agent_id = %s AND user_id = %s AND name = %s",
                (agent_id, user_id, name),
            )
        return current != 0

    def _locked_version(self, agent_id: str, user_id: str, name: str) -> int:
        # the row lock (or, for a file not there yet, the key lock) orders writers
        self.conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            (f"ctx\x1f{agent_id}\x1f{user_id}\x1f{name}",),
        )
        return self.version(agent_id, user_id, name)

    def all_of(self, agent_id: str) -> list[ContextFile]:
        rows = self.conn.execute(
            "SELECT agent_id, user_id, name, content, version FROM context_files"
            " WHERE agent_id = %s ORDER BY user_id, name",
            (agent_id,),
        ).fetchall()
        return [ContextFile.model_validate(r) for r in rows]


def owner_of(kind: AgentKind, name: str, user_id: str) -> str:
    """Whose copy of context file `name` a job of `user_id` writes: the user's, or the
    agent's ('')."""
    if not user_id:
        return ""
    if kind == "open" or name in PER_USER_WHEN_PREDEFINED:
        return user_id
    return ""


def jobs_may_write(kind: AgentKind, name: str) -> bool:
    """A predefined agent's own files are set by its operator, never by a job."""
    return kind == "open" or name in PER_USER_WHEN_PREDEFINED


PROMPT_FILES_SQL = (
    "SELECT DISTINCT ON (f.name) f.name, f.content FROM context_files f"
    " LEFT JOIN agents a ON a.id = f.agent_id"
    " WHERE f.agent_id = %s AND (f.user_id = '' OR (f.user_id = %s AND %s <> ''"
    " AND (coalesce(a.kind, 'open') = 'open' OR f.name = ANY(%s))))"
    " ORDER BY f.name, f.user_id = ''"
)
