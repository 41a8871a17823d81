"""web_search: results from the first provider that answers, in one shape.

Providers are tried in order (`CLAWQ_WEB_SEARCH_PROVIDERS`); one that fails is skipped
for the next, one that keeps failing is skipped by every worker for a while (a circuit
breaker in Redis), and a provider's daily quota holds across all workers. Results are
deduplicated by canonical URL and cached for 15 minutes. When all fail, one error names
each provider's reason.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from broker.protocol import Group
from workers.tool import SideEffect, Tool, ToolContext, ToolInput, ToolResult
from workers.tools.web.providers import Freshness


class WebSearchInput(ToolInput):
    query: str = Field(min_length=1, max_length=400, description="what to search for")
    count: int = Field(5, ge=1, le=10, description="results wanted")
    freshness: Freshness | None = Field(None, description="only results from the last …")
    country: str | None = Field(
        None, pattern=r"^[A-Za-z]{2}$", description="two-letter country code, e.g. DE"
    )
    language: str | None = Field(
        None, pattern=r"^[A-Za-z]{2}$", description="two-letter language code, e.g. de"
    )


class WebSearch(Tool[WebSearchInput]):
    name = "web_search"
    description = (
        "Search the web. Returns titles, URLs and snippets; read a page with web_fetch. "
        "freshness limits results to the last day, week, month or year."
    )
    group = Group.web
    input_model = WebSearchInput
    side_effect = SideEffect.read
    uses_egress = True
    default_permission = "allow"
    timeout_s = 60.0

    def summary(self, args: WebSearchInput) -> str:
        return f"web_search({args.query[:80]})"

    def concurrency_safe(self, args: WebSearchInput) -> bool:
        return True

    def run(self, args: WebSearchInput, ctx: ToolContext) -> ToolResult:
        from workers.egress.client import egress_for
        from workers.tools.web import providers as p
        from workers.tools.web.shared import Breaker, Quota, cache_get, cache_key, cache_put

        settings = ctx.settings
        query = p.Query.model_validate(args.model_dump())
        key = cache_key("search", query.model_dump())
        if (hit := cache_get(ctx.redis, key)) is not None:
            return _result(query, hit["hits"], hit["notes"], cached=True)
        egress = egress_for(settings)
        reasons, notes = [], []
        for name in p.configured(settings):
            breaker = quota = None
            if ctx.redis is not None:
                breaker = Breaker(
                    ctx.redis,
                    name,
                    settings.web_search_breaker_failures,
                    settings.web_search_breaker_cooldown_s,
                )
                if left := breaker.is_open():
                    reasons.append(f"{name}: skipped, failing lately (tried again in {left:.0f}s)")
                    continue
                limit = settings.web_search_quota_per_day.get(name)
                quota = Quota(ctx.redis, name, limit) if limit is not None else None
                if quota is not None and not quota.take():
                    reasons.append(f"{name}: today's quota of {limit} searches is used up")
                    continue
            try:
                answer = p.PROVIDERS[name](settings, egress).search(query)
            except Exception as exc:  # a provider's failure moves on to the next
                if breaker is not None:
                    breaker.failed()
                reasons.append(f"{name}: {p.failure(exc)}")
                continue
            if breaker is not None:
                breaker.succeeded()
            if answer.unhonoured:
                notes.append(f"{name} could not apply: {', '.join(answer.unhonoured)}")
            hits = _unique(answer.hits)[: query.count]
            if reasons:
                notes.insert(0, "before it: " + "; ".join(reasons))
            dumped = [h.model_dump() for h in hits]
            cache_put(ctx.redis, key, {"hits": dumped, "notes": notes}, settings.web_cache_ttl_s)
            return _result(query, dumped, notes, cached=False)
        return ToolResult.error(
            "web_search failed: " + ("; ".join(reasons) or "no provider is configured")
        )


def _unique(hits: list[Any]) -> list[Any]:
    from workers.tools.web.providers import canonical

    seen: set[str] = set()
    out = []
    for hit in hits:
        if (form := canonical(hit.url)) not in seen:
            seen.add(form)
            out.append(hit)
    return out


def _result(query: Any, hits: list[dict[str, Any]], notes: list[str], cached: bool) -> ToolResult:
    from workers.untrusted import wrap

    lines = []
    for n, hit in enumerate(hits, 1):
        when = f" ({hit['published']})" if hit["published"] else ""
        lines.append(f"{n}. {hit['title']}{when}\n   {hit['url']}\n   {hit['snippet']}".rstrip())
    provider = hits[0]["provider"] if hits else ""
    text = "\n".join(lines) if lines else "no results"
    body = wrap(f"web search ({provider or 'no provider'})", text)
    if notes:
        body += "\n" + "\n".join(f"[note: {n}]" for n in notes)
    if hits:
        body += "\n[read a result with web_fetch]"
    return ToolResult(
        for_llm=body,
        for_user=f"{len(hits)} results for {query.query!r} from {provider or 'nobody'}",
        metadata={"provider": provider, "results": hits, "cached": cached, "notes": notes},
    )
