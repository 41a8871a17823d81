"""Queries over the memory index: full text, trigrams, nearest embeddings (pgvector where
the server has it), and the chunks behind a result."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg.rows import dict_row
from pydantic import BaseModel

from broker.stores.memory_index import MemoryTables


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


class MemorySearch(MemoryTables):
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
