"""Embedding providers for memory: `openai` (any OpenAI-compatible /v1/embeddings: OpenAI,
Ollama, vLLM), `local` (a small model inside a wheel, offline; the `memory-local`
extra) and `none`. `auto` takes the first one configured.

An embedder's `name` (provider:model) is stored with every chunk it embedded, so chunks
of another model are never compared with this one's queries."""

from __future__ import annotations

import json
import threading
from typing import Protocol

import httpx
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from broker.config.settings import Settings
from broker.errors import RunError
from workers.egress.netguard import EgressError


class EmbedderError(RunError):
    """The provider is misconfigured or failed; indexing records it, search goes on
    with full text."""


class Embedder(Protocol):
    name: str
    dimensions: int

    def embed_passages(self, texts: list[str]) -> list[list[float]]: ...

    def embed_query(self, text: str) -> list[float]: ...


class Answered(RunError):
    """The provider answered with an error status."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"answered {status}: {text[:200]}")
        self.status = status


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, Answered):
        return exc.status == 429 or exc.status >= 500
    return isinstance(exc, EgressError) and exc.code in ("url_not_accessible", "too_many_requests")


class OpenAIEmbedder:
    """POST {base}/embeddings through the egress client, in batches; retried on 429, 5xx
    and transport errors. A provider on a private address (Ollama on this host) is
    reached once `CLAWQ_WEB_PRIVATE_ALLOW` names it."""

    BATCH = 96
    MAX_BYTES = 64 * 2**20  # 96 vectors of 3,072 floats as JSON, with room

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.base = settings.memory_openai_url.rstrip("/")
        self.model = settings.memory_openai_model
        self.extra = (
            {"dimensions": settings.memory_openai_dimensions}
            if settings.memory_openai_dimensions
            else {}
        )
        self.headers = {}
        if settings.memory_openai_api_key:
            self.headers["Authorization"] = f"Bearer {settings.memory_openai_api_key}"
        suffix = f"@{settings.memory_openai_dimensions}" if self.extra else ""
        self.name = f"openai:{self.model}{suffix}"
        self.dimensions = settings.memory_openai_dimensions or 0

    @retry(
        retry=retry_if_exception(_retryable),
        stop=stop_after_attempt(4),
        wait=wait_exponential(multiplier=0.5, max=8),
        reraise=True,
    )
    def _post(self, texts: list[str]) -> list[list[float]]:
        from workers.egress.client import egress_for

        got = egress_for(self.settings).request(
            "POST",
            f"{self.base}/embeddings",
            headers=self.headers,
            json={"model": self.model, "input": texts, **self.extra},
            max_bytes=self.MAX_BYTES,
            timeout=httpx.Timeout(60.0, connect=10.0),
        )
        if got.status >= 400:
            raise Answered(got.status, got.body.decode(errors="replace"))
        if got.truncated:
            raise EmbedderError(f"{self.base}: the answer is over {self.MAX_BYTES} bytes")
        data = sorted(json.loads(got.body)["data"], key=lambda d: d["index"])
        return [[float(x) for x in d["embedding"]] for d in data]

    def embed_passages(self, texts: list[str]) -> list[list[float]]:
        out: list[list[float]] = []
        try:
            for i in range(0, len(texts), self.BATCH):
                out.extend(self._post(texts[i : i + self.BATCH]))
        except Answered as exc:
            raise EmbedderError(f"{self.base} {exc}") from None
        except EgressError as exc:
            raise EmbedderError(f"{self.base}: {exc}") from None
        except (KeyError, ValueError, TypeError) as exc:
            raise EmbedderError(f"{self.base}: {type(exc).__name__}: {exc}") from None
        if out:
            self.dimensions = len(out[0])
        return out

    def embed_query(self, text: str) -> list[float]:
        return self.embed_passages([text])[0]


_made: dict[tuple[str, ...], Embedder | None] = {}
_lock = threading.Lock()


def _key(settings: Settings) -> tuple[str, ...]:
    return (
        settings.memory_embedder,
        settings.memory_openai_url,
        settings.memory_openai_model,
        str(settings.memory_openai_dimensions),
    )


def local_available() -> bool:
    from workers.tools.memory.local_model import available

    return available()


def choose(settings: Settings) -> str:
    """The provider `auto` means: the first configured of openai, local, none."""
    if settings.memory_embedder != "auto":
        return settings.memory_embedder
    if settings.memory_openai_url:
        return "openai"
    return "local" if local_available() else "none"


def for_settings(settings: Settings) -> Embedder | None:
    """This process's embedder for these settings (models load once per process)."""
    key = _key(settings)
    with _lock:
        if key not in _made:
            _made[key] = make(settings)
        found = _made[key]
        if isinstance(found, OpenAIEmbedder):
            found.settings = settings  # the egress policy in force now
        return found


def make(settings: Settings) -> Embedder | None:
    provider = choose(settings)
    if provider == "none":
        return None
    if provider == "openai":
        if not settings.memory_openai_url:
            raise EmbedderError("memory_embedder is openai but CLAWQ_MEMORY_OPENAI_URL is not set")
        return OpenAIEmbedder(settings)
    from workers.tools.memory.local_model import LocalEmbedder

    return LocalEmbedder()
