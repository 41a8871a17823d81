"""The exact cosine search used without pgvector: a scope's embeddings held in this
process as one normalised matrix, checked against the scope's chunk version on every
search (one small read), so it is never stale."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from broker.stores.memory import MemoryStore
from broker.stores.memory_search import Candidate

MAX_SCOPES = 32  # matrices kept per process, least recently used dropped first


@dataclass
class _Matrix:
    version: int
    ids: np.ndarray
    vectors: np.ndarray  # rows normalised to unit length, float32


_cache: OrderedDict[tuple[str, str, str], _Matrix] = OrderedDict()
_lock = threading.Lock()


def _load(store: MemoryStore, agent_id: str, user_id: str, model: str, version: int) -> _Matrix:
    ids, rows = store.scope_embeddings(agent_id, user_id, model)
    if not rows:
        return _Matrix(version, np.zeros(0, dtype=np.int64), np.zeros((0, 1), dtype=np.float32))
    vectors = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    vectors /= np.where(norms == 0, 1, norms)
    return _Matrix(version, np.asarray(ids, dtype=np.int64), vectors)


def exact_nearest(
    store: MemoryStore,
    agent_id: str,
    user_id: str,
    model: str,
    query: Sequence[float],
    limit: int,
) -> list[Candidate]:
    key = (agent_id, user_id, model)
    version = store.scope_version(agent_id, user_id)
    with _lock:
        held = _cache.get(key)
        if held is not None:
            _cache.move_to_end(key)
    if held is None or held.version != version:
        held = _load(store, agent_id, user_id, model, version)
        with _lock:
            _cache[key] = held
            _cache.move_to_end(key)
            while len(_cache) > MAX_SCOPES:
                _cache.popitem(last=False)
    if not len(held.ids):
        return []
    q = np.asarray(query, dtype=np.float32)
    q /= np.linalg.norm(q) or 1.0
    if q.shape[0] != held.vectors.shape[1]:
        return []  # another model's dimension: nothing comparable
    scores = held.vectors @ q
    n = min(limit, len(scores))
    top = np.argpartition(-scores, n - 1)[:n]
    top = top[np.argsort(-scores[top])]
    return [Candidate(chunk_id=int(held.ids[i]), score=float(scores[i])) for i in top]
