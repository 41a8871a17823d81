"""The index of memory documents in PostgreSQL: the outbox of documents to index (written in
the same transaction as the document, so an index task is never lost) and their chunks
with embeddings."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql
from pydantic import BaseModel

from broker.pg import features as pg_features

_FEATURES: weakref.WeakKeyDictionary[Any, pg_features.Features] = weakref.WeakKeyDictionary()


class MemoryDocument(BaseModel):
    id: int
    agent_id: str
    user_id: str
    path: str
    content: str
    version: int


class ChunkRow(BaseModel):
    """A chunk as the indexer writes it."""

    start_line: int
    end_line: int
    content: str
    hash: str
    model: str = ""
    embedding: list[float] | None = None


class MemoryTables:
    """One connection to the memory tables (autocommit, dict rows)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    @property
    def features(self) -> pg_features.Features:
        """Detected once per connection: a store is made per call, a search must not pay a
        catalog query each time."""
        found = _FEATURES.get(self.conn)
        if found is None:
            found = _FEATURES[self.conn] = pg_features.detect(self.conn)
        return found


class MemoryIndex(MemoryTables):
    # -- the outbox ------------------------------------------------------------------------

    def due(self, limit: int = 100) -> list[int]:
        """Documents whose index task is due again (never sent, lost or failed)."""
        rows = self.conn.execute(
            "UPDATE memory_outbox SET next_at = now() + interval '60 seconds'"
            " WHERE document_id IN (SELECT document_id FROM memory_outbox WHERE next_at <= now()"
            " ORDER BY next_at LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING document_id",
            (limit,),
        ).fetchall()
        return [int(r["document_id"]) for r in rows]

    def requeue_all(self, agent_id: str | None = None) -> int:
        """Queue every markdown document again (clawq memory reindex)."""
        where = "AND agent_id = %s" if agent_id else ""
        params: tuple[Any, ...] = (agent_id,) if agent_id else ()
        with self.conn.transaction():
            self.conn.execute(
                f"UPDATE memory_documents SET indexed_version = 0 WHERE path LIKE '%%.md' {where}",
                params,
            )
            cur = self.conn.execute(
                "INSERT INTO memory_outbox (document_id, version) SELECT id, version"
                f" FROM memory_documents WHERE path LIKE '%%.md' {where}"
                " ON CONFLICT (document_id) DO UPDATE SET version = excluded.version,"
                " attempts = 0, next_at = now()",
                params,
            )
        return cur.rowcount

    def outbox_job(self, document_id: int) -> str:
        row = self.conn.execute(
            "SELECT job_id FROM memory_outbox WHERE document_id = %s", (document_id,)
        ).fetchone()
        return str(row["job_id"]) if row else ""

    def index_failed(self, document_id: int, error: str, retry_s: float, max_s: float) -> int:
        """Record why indexing failed; the sweeper tries again after `retry_s`, doubled
        at every attempt up to `max_s`. Returns the attempts so far."""
        with self.conn.transaction():
            self.conn.execute(
                "UPDATE memory_documents SET index_error = %s WHERE id = %s",
                (error[:2000], document_id),
            )
            row = self.conn.execute(
                "UPDATE memory_outbox SET attempts = attempts + 1, next_at = now()"
                " + make_interval(secs => least(%s, %s * 2 ^ attempts)) WHERE document_id = %s"
                " RETURNING attempts",
                (max_s, retry_s, document_id),
            ).fetchone()
        return int(row["attempts"]) if row else 0

    # -- chunks ----------------------------------------------------------------------------

    def embeddings_by_hash(self, hashes: Sequence[str], model: str) -> dict[str, list[float]]:
        """Embeddings already made by `model` for these chunk contents (any document)."""
        if not hashes or not model:
            return {}
        rows = self.conn.execute(
            "SELECT DISTINCT ON (hash) hash, embedding FROM memory_chunks"
            " WHERE hash = ANY(%s) AND model = %s AND embedding IS NOT NULL",
            (list(hashes), model),
        ).fetchall()
        return {r["hash"]: r["embedding"] for r in rows}

    def replace_chunks(
        self, doc: MemoryDocument, chunks: Sequence[ChunkRow], *, error: str = ""
    ) -> bool:
        """The document's chunks as of `doc.version`; False when a newer version was
        written meanwhile (its own task indexes it)."""
        with self.conn.transaction():
            row = self.conn.execute(
                "SELECT version FROM memory_documents WHERE id = %s FOR UPDATE", (doc.id,)
            ).fetchone()
            if row is None or int(row["version"]) != doc.version:
                return False
            self.conn.execute("DELETE FROM memory_chunks WHERE document_id = %s", (doc.id,))
            with self.conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO memory_chunks (document_id, agent_id, user_id, start_line,"
                    " end_line, content, hash, model, embedding)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    [
                        (
                            doc.id,
                            doc.agent_id,
                            doc.user_id,
                            c.start_line,
                            c.end_line,
                            c.content,
                            c.hash,
                            c.model,
                            c.embedding,
                        )
                        for c in chunks
                    ],
                )
            self.bump_scope(doc.agent_id, doc.user_id)
            self.conn.execute(
                "UPDATE memory_documents SET indexed_version = %s, indexed_at = now(),"
                " index_error = %s WHERE id = %s",
                (doc.version, error, doc.id),
            )
            if not error:
                self.conn.execute(
                    "DELETE FROM memory_outbox WHERE document_id = %s AND version <= %s",
                    (doc.id, doc.version),
                )
        return True

    def bump_scope(self, agent_id: str, user_id: str) -> None:
        self.conn.execute(
            "INSERT INTO memory_scopes (agent_id, user_id, chunks_version)"
            " VALUES (%s, %s, nextval('document_versions')) ON CONFLICT (agent_id, user_id)"
            " DO UPDATE SET chunks_version = excluded.chunks_version",
            (agent_id, user_id),
        )

    def ensure_vector_index(self, model: str, dim: int) -> None:
        """pgvector's HNSW index for one model's embeddings (a partial expression index,
        since models differ in dimension)."""
        schema = self.features.vector
        if not schema:
            return
        name = vector_index_name(model)
        exists = self.conn.execute("SELECT to_regclass(%s) AS r", (name,)).fetchone()
        if exists and exists["r"] is not None:
            return
        self.conn.execute(
            f"CREATE INDEX IF NOT EXISTS {name} ON memory_chunks USING hnsw"
            f" ((embedding::{schema}.vector({dim})) {schema}.vector_cosine_ops)"
            f" WHERE model = {sql.quote(model)}"
        )


def vector_index_name(model: str) -> str:
    import hashlib

    return "memory_chunks_hnsw_" + hashlib.sha1(model.encode()).hexdigest()[:10]
