"""memory_search: hybrid search of the job's agent and user memory.

Two channels, each asked for `candidate_multiplier` times the results wanted:
- text: full text (english and simple configurations, any term, all terms count double)
  and, for CJK or a word or two, trigram word similarity (partial words); its score is
  the best of the FTS rank relative to the best FTS hit and the trigram similarity, so
  both lie in [0, 1];
- vector: cosine similarity of the query's embedding, min-max normalised over its
  candidates (raw cosines of small models crowd into a narrow band).
The fused score is the weighted mean (0.7 vector, 0.3 text by default) of the channels
that ran; personal results come before global ones on ties.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import Field

from broker.config.settings import Settings
from broker.protocol import Group
from broker.stores.memory import MemoryStore
from broker.stores.memory_search import Candidate
from workers.tool import SideEffect, Tool, ToolContext, ToolError, ToolInput, ToolResult
from workers.tools.memory import embed


class MemorySearchInput(ToolInput):
    query: str = Field(min_length=1, max_length=2000, description="What to look for")
    max_results: int | None = Field(None, ge=1, le=50, description="At most this many (6)")
    min_score: float = Field(0.0, ge=0, le=1, description="Drop results scored below this")


@dataclass
class Hit:
    path: str
    start_line: int
    end_line: int
    snippet: str
    score: float
    scope: str  # "user" or "global"
    scores: dict[str, float] = field(default_factory=dict)


def _vector(
    store: MemoryStore, agent: str, user: str, query: str, limit: int, settings: Settings
) -> list[Candidate]:
    embedder = embed.for_settings(settings)
    if embedder is None:
        return []
    vector = embedder.embed_query(query)
    if store.features.vector:
        return store.nearest(agent, user, embedder.name, vector, limit)
    from workers.tools.memory.vectors import exact_nearest

    return exact_nearest(store, agent, user, embedder.name, vector, limit)


def fuzzy(query: str) -> bool:
    """Whether trigrams can find what full text cannot: CJK (no word breaks for the
    parser) or a word or two (perhaps cut short). A long query is left to full text and
    vectors: its trigram search costs seconds over 100,000 chunks and finds nothing more."""
    return len(query.split()) <= 2 or any(
        "\u3040" <= ch <= "\u30ff" or "\u3400" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7af"
        for ch in query
    )


def search(
    store: MemoryStore,
    agent: str,
    user: str,
    query: str,
    settings: Settings,
    max_results: int | None = None,
    min_score: float = 0.0,
    channels: tuple[str, ...] = ("text", "vector"),
) -> list[Hit]:
    wanted = max_results or settings.memory_max_results
    limit = wanted * settings.memory_candidate_multiplier
    fts = store.fts(agent, user, query, limit) if "text" in channels else []
    tri = store.trigram(agent, user, query, limit) if "text" in channels and fuzzy(query) else []
    vec = _vector(store, agent, user, query, limit, settings) if "vector" in channels else []

    best_fts = max((c.score for c in fts), default=0.0) or 1.0
    text: dict[int, float] = {}
    parts: dict[int, dict[str, float]] = {}
    for c in fts:
        text[c.chunk_id] = c.score / best_fts
        parts.setdefault(c.chunk_id, {})["fts"] = round(c.score, 4)
    for c in tri:
        text[c.chunk_id] = max(text.get(c.chunk_id, 0.0), c.score)
        parts.setdefault(c.chunk_id, {})["trigram"] = round(c.score, 4)
    vector: dict[int, float] = {}
    if vec:
        low, high = min(c.score for c in vec), max(c.score for c in vec)
        for c in vec:
            vector[c.chunk_id] = (c.score - low) / (high - low) if high > low else 1.0
            parts.setdefault(c.chunk_id, {})["vector"] = round(c.score, 4)

    wv = settings.memory_vector_weight if vec else 0.0
    wt = settings.memory_text_weight if (fts or tri or not vec) else 0.0
    total = (wv + wt) or 1.0
    fused = {
        cid: (wv * vector.get(cid, 0.0) + wt * text.get(cid, 0.0)) / total
        for cid in set(text) | set(vector)
    }
    found = store.hits(list(fused))
    cap = settings.memory_snippet_chars
    hits = []
    for cid, score in fused.items():
        row = found.get(cid)
        if row is None or score < min_score:
            continue
        snippet = row.content if len(row.content) <= cap else row.content[: cap - 1] + "…"
        hits.append(
            Hit(
                path=row.path,
                start_line=row.start_line,
                end_line=row.end_line,
                snippet=snippet,
                score=round(score, 4),
                scope="user" if row.user_id else "global",
                scores={
                    **parts.get(cid, {}),
                    "text": round(text.get(cid, 0.0), 4),
                    **({"vector_norm": round(vector.get(cid, 0.0), 4)} if vec else {}),
                },
            )
        )
    hits.sort(key=lambda h: (-h.score, h.scope != "user", h.path, h.start_line))
    return hits[:wanted]


def render(hits: list[Hit]) -> str:
    if not hits:
        return "no memory matched; try other words, or memory_get a path you know"
    out = []
    for n, h in enumerate(hits, start=1):
        channels = ", ".join(f"{k} {v:.2f}" for k, v in h.scores.items())
        out.append(
            f"{n}. {h.path}:{h.start_line}-{h.end_line} (score {h.score:.2f}; {channels};"
            f" {'your memory' if h.scope == 'user' else 'global memory'})\n{h.snippet}"
        )
    return "\n\n".join(out)


class MemorySearch(Tool[MemorySearchInput]):
    name = "memory_search"
    description = (
        "Search your memory (MEMORY.md and memory/*.md, yours and the agent's global ones) "
        "by meaning and by words. Returns paths with line ranges and snippets; read more "
        "with memory_get."
    )
    group = Group.memory
    input_model = MemorySearchInput
    side_effect = SideEffect.read
    uses_egress = True
    default_permission = "allow"
    timeout_s = 30.0

    def concurrency_safe(self, args: MemorySearchInput) -> bool:
        return True

    def run(self, args: MemorySearchInput, ctx: ToolContext) -> ToolResult:
        if ctx.store is None:
            raise ToolError("memory_search needs the database; none is configured here")
        c = ctx.context
        store = MemoryStore(ctx.store().conn)
        hits = search(
            store, c.agent_id, c.user_id, args.query, ctx.settings, args.max_results, args.min_score
        )
        return ToolResult(
            for_llm=render(hits),
            for_user=f"memory_search: {len(hits)} results",
            metadata={"results": [h.__dict__ for h in hits]},
        )
