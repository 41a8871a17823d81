"""Memory documents, their chunks and the index outbox, in PostgreSQL.

A document belongs to an agent and a user; user '' is the agent's global memory. A write
of a document to be indexed adds an outbox row in the same transaction, so an index task
is never lost: the sweeper sends again what no task finished."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from pydantic import BaseModel

from broker.pg import features as pg_features
from broker.stores.context_files import VersionConflict

# the paths of every document a user sees (agent_id, user_id), the user's copy first
PATHS_SQL = (
    "SELECT DISTINCT ON (path) path, user_id FROM memory_documents"
    " WHERE agent_id = %s AND user_id IN (%s, '') ORDER BY path, user_id = ''"
)


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


class Candidate(BaseModel):
    """One chunk found by one channel of a search, with that channel's raw score."""

    chunk_id: int
    score: float


class ChunkHit(BaseModel):
    chunk_id: int
    path: str
    user_id: str
    start_line: int
    end_line: int
    content: str


DOC_COLUMNS = "id, agent_id, user_id, path, content, version"
_FEATURES: weakref.WeakKeyDictionary[Any, pg_features.Features] = weakref.WeakKeyDictionary()


class MemoryStore:
    """Documents, chunks and the outbox on one connection (autocommit, dict rows)."""

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

    # -- search ----------------------------------------------------------------------------

    def scope_version(self, agent_id: str, user_id: str) -> int:
        row = self.conn.execute(
            "SELECT coalesce(sum(chunks_version), 0) AS v FROM memory_scopes"
            " WHERE agent_id = %s AND user_id IN (%s, '')",
            (agent_id, user_id),
        ).fetchone()
        return int(row["v"]) if row else 0

    def fts(self, agent_id: str, user_id: str, query: str, limit: int) -> list[Candidate]:
        """Full text over an english (stemmed) and a simple vector: any term matches, all
        terms (websearch syntax) count double."""
        rows = self.conn.execute(
            "WITH q AS (SELECT websearch_to_tsquery('english', %(q)s) AS e_all,"
            " websearch_to_tsquery('simple', %(q)s) AS s_all,"
            " (SELECT string_agg(quote_literal(l), ' | ') FROM"
            "  unnest(tsvector_to_array(to_tsvector('english', %(q)s))) l) AS e_any,"
            " (SELECT string_agg(quote_literal(l), ' | ') FROM"
            "  unnest(tsvector_to_array(to_tsvector('simple', %(q)s))) l) AS s_any),"
            " qq AS (SELECT e_all, s_all, coalesce(to_tsquery('english', e_any), e_all) AS e,"
            " coalesce(to_tsquery('simple', s_any), s_all) AS s FROM q)"
            " SELECT c.id, greatest("
            "  ts_rank_cd(c.tsv_english, qq.e, 1) * (CASE WHEN c.tsv_english @@ qq.e_all"
            "   THEN 2 ELSE 1 END),"
            "  ts_rank_cd(c.tsv_simple, qq.s, 1) * (CASE WHEN c.tsv_simple @@ qq.s_all"
            "   THEN 2 ELSE 1 END)) AS score"
            " FROM memory_chunks c, qq WHERE c.agent_id = %(a)s AND c.user_id IN (%(u)s, '')"
            " AND (c.tsv_english @@ qq.e OR c.tsv_simple @@ qq.s)"
            " ORDER BY score DESC LIMIT %(n)s",
            {"q": query, "a": agent_id, "u": user_id, "n": limit},
        ).fetchall()
        return [Candidate(chunk_id=r["id"], score=float(r["score"])) for r in rows]

    def trigram(self, agent_id: str, user_id: str, query: str, limit: int) -> list[Candidate]:
        """Trigram word similarity (CJK, partial words); none without pg_trgm."""
        schema = self.features.trgm
        if not schema:
            return []
        with self.conn.transaction():
            self.conn.execute("SET LOCAL pg_trgm.word_similarity_threshold = 0.5")
            rows = self.conn.execute(
                f"SELECT id, {schema}.word_similarity(%(q)s, content) AS score"
                " FROM memory_chunks WHERE agent_id = %(a)s AND user_id IN (%(u)s, '')"
                f" AND %(q)s OPERATOR({schema}.<%%) content ORDER BY score DESC LIMIT %(n)s",
                {"q": query, "a": agent_id, "u": user_id, "n": limit},
            ).fetchall()
        return [Candidate(chunk_id=r["id"], score=float(r["score"])) for r in rows]

    def nearest(
        self, agent_id: str, user_id: str, model: str, vector: Sequence[float], limit: int
    ) -> list[Candidate]:
        """pgvector's HNSW search; the caller falls back to an exact search without it."""
        schema = self.features.vector
        assert schema, "nearest() needs pgvector"
        dim = len(vector)
        cast = f"{schema}.vector({dim})"
        with self.conn.transaction():
            self.conn.execute(f"SET LOCAL hnsw.ef_search = {max(40, limit * 2)}")
            rows = self.conn.execute(
                f"SELECT id, 1 - (embedding::{cast} OPERATOR({schema}.<=>) %(v)s::{cast})"
                " AS score FROM memory_chunks WHERE model = %(m)s AND agent_id = %(a)s"
                " AND user_id IN (%(u)s, '')"
                f" ORDER BY embedding::{cast} OPERATOR({schema}.<=>) %(v)s::{cast}"
                " LIMIT %(n)s",
                {"v": list(vector), "m": model, "a": agent_id, "u": user_id, "n": limit},
            ).fetchall()
        return [Candidate(chunk_id=r["id"], score=float(r["score"])) for r in rows]

    def scope_embeddings(
        self, agent_id: str, user_id: str, model: str
    ) -> tuple[list[int], list[list[float]]]:
        """Every embedding of the scope by `model`, for the exact search."""
        ids: list[int] = []
        vectors: list[list[float]] = []
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(
                "SELECT id, embedding FROM memory_chunks WHERE model = %s AND agent_id = %s"
                " AND user_id IN (%s, '') AND embedding IS NOT NULL",
                (model, agent_id, user_id),
            )
            for row in cur:
                ids.append(row["id"])
                vectors.append(row["embedding"])
        return ids, vectors

    def hits(self, chunk_ids: Sequence[int]) -> dict[int, ChunkHit]:
        rows = self.conn.execute(
            "SELECT c.id AS chunk_id, d.path, c.user_id, c.start_line, c.end_line, c.content"
            " FROM memory_chunks c JOIN memory_documents d ON d.id = c.document_id"
            " WHERE c.id = ANY(%s)",
            (list(chunk_ids),),
        ).fetchall()
        return {r["chunk_id"]: ChunkHit.model_validate(r) for r in rows}

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


def vector_index_name(model: str) -> str:
    import hashlib

    return "memory_chunks_hnsw_" + hashlib.sha1(model.encode()).hexdigest()[:10]
