"""memory.index: chunk a memory document, embed the chunks not embedded before (keyed by
content hash), and replace its chunks, on the `memory` queue.

Writes never wait for this: the fs tool stores the document and an outbox row in one
transaction and sends the task. Full text is indexed whatever happens to the embeddings;
a failure is kept on the document (`clawq memory status`), sent to the job as an event,
and retried with a backoff by the sweeper, never failing the write."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from pydantic import BaseModel

from broker.config.settings import Settings
from broker.protocol import Event
from broker.stores.memory import MemoryStore
from broker.stores.memory_index import ChunkRow
from workers.tools.memory import embed
from workers.tools.memory.chunking import chunk_markdown

log = logging.getLogger(__name__)

INDEX_TASK = "clawq.memory.index"
MAX_RETRY_S = 3600.0


class IndexOutcome(BaseModel):
    document_id: int
    state: str  # indexed | stale | gone | failed
    chunks: int = 0
    embedded: int = 0  # embeddings made now
    reused: int = 0  # embeddings found by content hash
    error: str = ""


def index_document(store: MemoryStore, settings: Settings, document_id: int) -> IndexOutcome:
    doc = store.by_id(document_id)
    if doc is None:
        return IndexOutcome(document_id=document_id, state="gone")
    chunks = chunk_markdown(
        doc.content, settings.memory_chunk_tokens, settings.memory_chunk_overlap_tokens
    )
    rows = [
        ChunkRow(start_line=c.start_line, end_line=c.end_line, content=c.content, hash=c.hash)
        for c in chunks
    ]
    outcome = IndexOutcome(document_id=doc.id, state="indexed", chunks=len(rows))
    embedder = embed.for_settings(settings)
    if embedder is not None and rows:
        known = store.embeddings_by_hash([r.hash for r in rows], embedder.name)
        outcome.reused = sum(1 for r in rows if r.hash in known)
        missing = list({r.hash: r for r in rows if r.hash not in known}.values())
        try:
            if missing:
                made = embedder.embed_passages([r.content for r in missing])
                known.update({r.hash: v for r, v in zip(missing, made, strict=True)})
                outcome.embedded = len(missing)
            store.ensure_vector_index(embedder.name, embedder.dimensions)
        except Exception as exc:  # the provider failed: full text is indexed all the same
            outcome.error = f"embedding with {embedder.name} failed: {exc}"[:500]
            outcome.embedded = 0
        for r in rows:
            if r.hash in known:
                r.model, r.embedding = embedder.name, known[r.hash]
    if not store.replace_chunks(doc, rows, error=outcome.error):
        return IndexOutcome(document_id=doc.id, state="stale")  # a newer write re-indexes
    if outcome.error:
        outcome.state = "failed"
    return outcome


def run_index_task(
    settings: Settings, conn_store: Any, redis_client: Any, document_id: int
) -> None:
    """The task body: index, and on failure record it, tell the job, schedule a retry."""
    from broker.redis import events

    store = MemoryStore(conn_store.conn)
    job_id = store.outbox_job(document_id)
    try:
        outcome = index_document(store, settings, document_id)
    except Exception as exc:  # e.g. the database went away mid-way
        log.exception("indexing memory document %s failed", document_id)
        outcome = IndexOutcome(document_id=document_id, state="failed", error=str(exc)[:500])
    if outcome.state != "failed":
        log.info("memory document %s: %s", document_id, outcome.model_dump_json())
        return
    try:
        store.index_failed(document_id, outcome.error, settings.memory_index_retry_s, MAX_RETRY_S)
    except Exception:
        log.exception("could not record the index failure of document %s", document_id)
    if job_id and redis_client is not None:
        events.emit_sync(
            redis_client,
            Event(
                job_id=job_id,
                type="memory_index_failed",
                data={"document_id": document_id, "error": outcome.error},
            ),
            settings.events_ttl_s,
        )


class Sweeper(threading.Thread):
    """Sends the index task again for outbox rows no task finished: a lost message, a
    worker that died, a failure whose retry is due. One per memory worker process."""

    def __init__(self, settings: Settings, send: Any) -> None:
        super().__init__(name="memory-outbox-sweeper", daemon=True)
        self.settings = settings
        self.send = send
        self.stopping = threading.Event()

    def run(self) -> None:
        from broker.pg.store import Store

        store: Store | None = None
        while not self.stopping.wait(self.settings.memory_outbox_sweep_s):
            try:
                store = store or Store(self.settings.database_url)
                for document_id in MemoryStore(store.conn).due():
                    self.send(document_id)
            except Exception as exc:
                log.warning("memory outbox sweep failed: %s", exc)
                if store is not None:
                    store.close()
                store = None
                time.sleep(1)
