"""Optional PostgreSQL extensions memory search uses when the server has them: pg_trgm
(trigram matching, for CJK and partial words) and pgvector (an HNSW index over the
embeddings). Without them search still works: no trigram channel, and an exact cosine
search over the stored arrays.

Extensions are found by name wherever they were installed, and their objects are named
with that schema, so a search_path without it (a schema per tenant or per test) still
reaches them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import tuple_row

log = logging.getLogger(__name__)

WANTED = ("pg_trgm", "vector")


@dataclass(frozen=True)
class Features:
    trgm: str | None = None  # the schema of pg_trgm, or None
    vector: str | None = None  # the schema of pgvector, or None

    def describe(self) -> str:
        parts = [
            "pg_trgm" if self.trgm else "no pg_trgm (no trigram matching)",
            "pgvector" if self.vector else "no pgvector (exact cosine search)",
        ]
        return ", ".join(parts)


def detect(conn: psycopg.Connection[Any]) -> Features:
    cur = conn.cursor(row_factory=tuple_row)
    rows = cur.execute(
        "SELECT extname, extnamespace::regnamespace::text FROM pg_extension"
        " WHERE extname = ANY(%s)",
        (list(WANTED),),
    ).fetchall()
    found = {name: schema for name, schema in rows}
    return Features(trgm=found.get("pg_trgm"), vector=found.get("vector"))


def install(conn: psycopg.Connection[Any]) -> Features:
    """Create the wanted extensions that the server offers and that are not there yet,
    in `public`; one that cannot be created (no privilege) is left out with a warning."""
    cur = conn.cursor(row_factory=tuple_row)
    offered = {
        row[0]
        for row in cur.execute(
            "SELECT name FROM pg_available_extensions WHERE name = ANY(%s)"
            " AND installed_version IS NULL",
            (list(WANTED),),
        )
    }
    for name in WANTED:
        if name not in offered:
            continue
        try:
            with conn.transaction():
                conn.execute(f'CREATE EXTENSION IF NOT EXISTS "{name}" WITH SCHEMA public')
        except psycopg.Error as exc:
            log.warning("PostgreSQL extension %s is offered but was not created: %s", name, exc)
    features = detect(conn)
    exists = cur.execute("SELECT to_regclass('memory_chunks_trigram')").fetchone()
    if features.trgm and exists and exists[0] is None:  # checked first: CREATE INDEX locks
        conn.execute(
            "CREATE INDEX IF NOT EXISTS memory_chunks_trigram ON memory_chunks"
            f" USING gin (content {features.trgm}.gin_trgm_ops)"
        )
    return features
