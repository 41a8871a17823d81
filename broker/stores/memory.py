"""Memory documents, their chunks and the index outbox, in PostgreSQL.

A document belongs to an agent and a user; user '' is the agent's global memory. A write
of a document to be indexed adds an outbox row in the same transaction, so an index task
is never lost: the sweeper sends again what no task finished."""

from __future__ import annotations

from typing import Any

from broker.stores.context_files import VersionConflict
from broker.stores.memory_index import MemoryDocument, MemoryIndex
from broker.stores.memory_search import MemorySearch

# what a user sees of the memory (agent_id, user_id: theirs and the agent's global), one
# text column each, for list_files: below a directory (its prefix, ending in '/') ...
PATHS_UNDER_SQL = (
    "SELECT DISTINCT path FROM memory_documents"
    " WHERE agent_id = %s AND user_id IN (%s, '') AND starts_with(path, %s)"
)
# ... and at the workspace root: MEMORY.md, memory.md, and 'memory/' if anything is in it
# (at most three rows, however many documents the agent keeps)
ROOT_NAMES_SQL = (
    "SELECT path FROM memory_documents WHERE agent_id = %s AND user_id IN (%s, '')"
    " AND path IN ('MEMORY.md', 'memory.md')"
    " UNION SELECT 'memory/' WHERE EXISTS (SELECT 1 FROM memory_documents"
    " WHERE agent_id = %s AND user_id IN (%s, '') AND starts_with(path, 'memory/'))"
)


DOC_COLUMNS = "id, agent_id, user_id, path, content, version"


class MemoryStore(MemoryIndex, MemorySearch):
    """Documents, chunks and the outbox on one connection (autocommit, dict rows): the
    documents here, their index (memory_index.py) and its queries (memory_search.py)."""

    # -- documents -------------------------------------------------------------------------

    def get(self, agent_id: str, user_id: str, path: str) -> MemoryDocument | None:
        """The user's copy of `path`, else the agent's global one."""
        row = self.conn.execute(
            f"SELECT {DOC_COLUMNS} FROM memory_documents WHERE agent_id = %s"
            " AND user_id IN (%s, '') AND path = %s ORDER BY user_id = '' LIMIT 1",
            (agent_id, user_id, path),
        ).fetchone()
        return MemoryDocument.model_validate(row) if row else None

    def exact(self, agent_id: str, user_id: str, path: str) -> MemoryDocument | None:
        row = self.conn.execute(
            f"SELECT {DOC_COLUMNS} FROM memory_documents WHERE agent_id = %s AND user_id = %s"
            " AND path = %s",
            (agent_id, user_id, path),
        ).fetchone()
        return MemoryDocument.model_validate(row) if row else None

    def by_id(self, document_id: int) -> MemoryDocument | None:
        row = self.conn.execute(
            f"SELECT {DOC_COLUMNS} FROM memory_documents WHERE id = %s", (document_id,)
        ).fetchone()
        return MemoryDocument.model_validate(row) if row else None

    def put(
        self,
        agent_id: str,
        user_id: str,
        path: str,
        content: str,
        expected: int | None,
        *,
        index: bool,
        job_id: str = "",
    ) -> MemoryDocument:
        """Write the document if its version is still `expected` (0: absent; None: any,
        for appends); with `index`, queue it for indexing in the same transaction."""
        with self.conn.transaction():
            self._lock(agent_id, user_id, path)
            current = self.exact(agent_id, user_id, path)
            if expected is not None and (current.version if current else 0) != expected:
                raise VersionConflict(path, current.version if current else 0)
            row = self.conn.execute(
                "INSERT INTO memory_documents (agent_id, user_id, path, content)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (agent_id, user_id, path) DO UPDATE"
                " SET content = excluded.content, version = nextval('document_versions'),"
                f" updated_at = now() RETURNING {DOC_COLUMNS}",
                (agent_id, user_id, path, content),
            ).fetchone()
            doc = MemoryDocument.model_validate(row)
            if index:
                self.conn.execute(
                    "INSERT INTO memory_outbox (document_id, version, job_id, next_at)"
                    " VALUES (%s, %s, %s, now() + interval '60 seconds')"
                    " ON CONFLICT (document_id) DO UPDATE SET version = excluded.version,"
                    " job_id = excluded.job_id, attempts = 0, next_at = excluded.next_at",
                    (doc.id, doc.version, job_id),
                )
        return doc

    def append(
        self, agent_id: str, user_id: str, path: str, text: str, *, index: bool, job_id: str = ""
    ) -> MemoryDocument:
        with self.conn.transaction():
            self._lock(agent_id, user_id, path)
            current = self.exact(agent_id, user_id, path)
            content = (current.content if current else "") + text
            return self.put(agent_id, user_id, path, content, None, index=index, job_id=job_id)

    def _lock(self, agent_id: str, user_id: str, path: str) -> None:
        self.conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            (f"mem\x1f{agent_id}\x1f{user_id}\x1f{path}",),
        )

    def documents(self, agent_id: str | None = None) -> list[MemoryDocument]:
        where, params = ("WHERE agent_id = %s", (agent_id,)) if agent_id else ("", ())
        rows = self.conn.execute(
            f"SELECT {DOC_COLUMNS} FROM memory_documents {where} ORDER BY id", params
        ).fetchall()
        return [MemoryDocument.model_validate(r) for r in rows]

    # -- operators -------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        row = self.conn.execute(
            "SELECT (SELECT count(*) FROM memory_documents) AS documents,"
            " (SELECT count(*) FROM memory_documents WHERE path LIKE '%%.md'"
            "  AND indexed_version = version AND index_error = '') AS indexed,"
            " (SELECT count(*) FROM memory_outbox) AS pending,"
            " (SELECT count(*) FROM memory_chunks) AS chunks,"
            " (SELECT count(*) FROM memory_chunks WHERE embedding IS NOT NULL) AS embedded"
        ).fetchone()
        assert row is not None
        errors = self.conn.execute(
            "SELECT agent_id, user_id, path, index_error FROM memory_documents"
            " WHERE index_error <> '' ORDER BY updated_at DESC LIMIT 20"
        ).fetchall()
        models = self.conn.execute(
            "SELECT model, count(*) AS chunks FROM memory_chunks WHERE model <> ''"
            " GROUP BY model ORDER BY model"
        ).fetchall()
        return {
            **row,
            "errors": errors,
            "models": models,
            "features": self.features.describe(),
        }
