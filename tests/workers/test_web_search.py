"""web_search against local servers that speak each provider's documented API (Brave,
Tavily, SearXNG, DuckDuckGo's HTML endpoint), and its fallback, circuit breaker, quota and
cache on real Redis."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from broker.config.settings import Settings
from broker.protocol import CallContext
from tests.conftest import Isolated
from tests.sites import Reply, Seen, Site
from workers.execute import run_tool
from workers.registry import default_registry
from workers.tool import ToolContext, ToolResult
from workers.tools.web.providers import SearchConfigError, canonical, configured

REGISTRY = default_registry()
BRAVE_KEY, TAVILY_KEY = "brave-test-key", "tvly-test-key"


def brave(seen: Seen) -> Reply:
    if seen.headers.get("x-subscription-token") != BRAVE_KEY:
        return Reply(401, b'{"error": "invalid token"}', "application/json")
    results = [
        {
            "title": f"Brave {n} for {seen.query['q'][0]}",
            "url": f"https://b{n}.example/page",
            "description": f"snippet {n}",
            "page_age": "2026-11-30T10:00:00",
        }
        for n in range(int(seen.query["count"][0]))
    ]
    results.append({"title": "dup", "url": "https://B0.example:443/page/?utm_source=x#top"})
    return Reply(200, json.dumps({"web": {"results": results}}).encode(), "application/json")


def tavily(seen: Seen) -> Reply:
    if seen.headers.get("authorization") != f"Bearer {TAVILY_KEY}":
        return Reply(401, b'{"detail": "unauthorized"}', "application/json")
    asked = seen.json()
    results = [
        {"title": f"Tavily {n}", "url": f"https://t{n}.example/", "content": "c", "score": 0.9}
        for n in range(asked["max_results"])
    ]
    return Reply(
        200, json.dumps({"query": asked["query"], "results": results}).encode(), "application/json"
    )


def searxng(seen: Seen) -> Reply:
    if seen.query.get("format") != ["json"]:
        return Reply(403, b"forbidden")
    results = [
        {
            "title": f"Searx {n}",
            "url": f"https://s{n}.example/",
            "content": "sx",
            "publishedDate": "2026-11-01",
        }
        for n in range(20)
    ]
    return Reply(200, json.dumps({"results": results}).encode(), "application/json")


def duckduckgo(seen: Seen) -> Reply:
    form = seen.form()
    rows = "".join(
        f'<div class="links_main links_deep result__body"><h2 class="result__title">'
        f'<a class="result__a" href="https://d{n}.example/">Duck {n} {form["q"][0]}</a></h2>'
        f'<a class="result__snippet" href="https://d{n}.example/">duck snippet {n}</a></div>'
        for n in range(4)
    )
    return Reply(200, f"<html><body>{rows}</body></html>".encode(), "text/html; charset=utf-8")


@pytest.fixture
def providers() -> Iterator[Site]:
    routes: dict[str, Any] = {
        "/res/v1/web/search": brave,
        "/search": lambda s: tavily(s) if s.method == "POST" else searxng(s),
        "/html/": duckduckgo,
    }
    with Site(routes) as site:
        yield site


def settings_for(isolated: Isolated, site: Site, **extra: Any) -> Settings:
    return isolated.settings.model_copy(
        update={
            "web_private_allow": [site.endpoint],
            "brave_base_url": site.url,
            "brave_api_key": BRAVE_KEY,
            "tavily_base_url": site.url,
            "tavily_api_key": TAVILY_KEY,
            "searxng_url": site.url,
            "duckduckgo_url": f"{site.url}/html/",
            **extra,
        }
    )


def search(settings: Settings, client: redis.Redis | None = None, **args: Any) -> ToolResult:
    ctx = ToolContext(CallContext(workspace="/tmp"), settings, redis=client)
    return run_tool(REGISTRY, "web_search", args, ctx)


@pytest.mark.parametrize("provider", ["brave", "tavily", "searxng", "duckduckgo"])
def test_each_provider_maps_to_one_shape(
    provider: str, providers: Site, isolated: Isolated
) -> None:
    settings = settings_for(isolated, providers, web_search_providers=[provider])
    result = search(settings, query="ferry times", count=3, freshness="week")
    assert not result.is_error, result.for_llm
    hits = result.metadata["results"]
    assert len(hits) == 3 and {h["provider"] for h in hits} == {provider}
    assert all(h["url"].startswith("https://") and h["title"] for h in hits)
    assert result.for_llm.startswith(f"[untrusted content from web search ({provider})")
    assert "1. " in result.for_llm and "[read a result with web_fetch]" in result.for_llm
    (request,) = providers.seen
    if provider == "brave":
        assert request.query["freshness"] == ["pw"] and request.query["q"] == ["ferry times"]
        assert hits[0]["published"] == "2026-11-30T10:00:00"
    elif provider == "tavily":
        assert request.json() == {
            "query": "ferry times",
            "max_results": 3,
            "topic": "general",
            "time_range": "week",
        }
    elif provider == "searxng":
        assert request.query["time_range"] == ["week"] and hits[0]["published"] == "2026-11-01"
    else:
        assert request.form()["df"] == ["w"] and request.form()["q"] == ["ferry times"]
        assert hits[0]["snippet"] == "duck snippet 0"


def test_unhonoured_options_are_said_and_duplicates_dropped(
    providers: Site, isolated: Isolated
) -> None:
    tav = search(
        settings_for(isolated, providers, web_search_providers=["tavily"]),
        query="q",
        country="DE",
        language="de",
    )
    assert "[note: tavily could not apply: country, language]" in tav.for_llm
    br = search(
        settings_for(isolated, providers, web_search_providers=["brave"]), query="q", count=10
    )
    urls = [h["url"] for h in br.metadata["results"]]
    assert len(urls) == 10 and len({canonical(u) for u in urls}) == 10  # the duplicate is gone
    assert canonical("https://B0.example:443/page/?utm_source=x#top") == "https://b0.example/page"


def test_a_failing_provider_falls_through_then_its_breaker_opens(
    providers: Site, isolated: Isolated
) -> None:
    client = redis.Redis.from_url(isolated.redis_url)
    settings = settings_for(
        isolated, providers, brave_api_key="wrong", web_search_providers=["brave", "searxng"]
    )
    for n in range(3):
        result = search(settings, client, query=f"q{n}")
        assert result.metadata["provider"] == "searxng"
        assert "before it: brave: the API key was refused (HTTP 401)" in result.for_llm
    fourth = search(settings, client, query="q3")  # a fresh query: not from the cache
    assert "brave: skipped, failing lately" in fourth.for_llm
    assert [s.path for s in providers.seen].count("/res/v1/web/search") == 3
    client.close()


def test_a_quota_holds_across_workers_and_the_cache_answers_repeats(
    providers: Site, isolated: Isolated, day: Callable[[str], None]
) -> None:
    settings = settings_for(
        isolated,
        providers,
        web_search_providers=["brave", "duckduckgo"],
        web_search_quota_per_day={"brave": 1},
    )
    one, other = (redis.Redis.from_url(isolated.redis_url) for _ in range(2))  # two workers
    assert search(settings, one, query="a").metadata["provider"] == "brave"
    spent = search(settings, other, query="b")
    assert spent.metadata["provider"] == "duckduckgo"
    assert "brave: today's quota of 1 searches is used up" in spent.for_llm
    again = search(settings, other, query="a")
    assert again.metadata["cached"] and again.metadata["provider"] == "brave"
    assert len(providers.seen) == 2
    day("20260602")  # a new UTC day: a new quota
    assert search(settings, other, query="c").metadata["provider"] == "brave"
    one.close()
    other.close()


def test_all_failing_gives_one_error_naming_each(providers: Site, isolated: Isolated) -> None:
    settings = settings_for(
        isolated,
        providers,
        brave_api_key="wrong",
        tavily_api_key="wrong",
        web_search_providers=["brave", "tavily"],
    )
    result = search(settings, query="x")
    assert result.is_error and result.for_llm == (
        "web_search failed: brave: the API key was refused (HTTP 401); "
        "tavily: the API key was refused (HTTP 401)"
    )


def test_a_listed_provider_without_its_key_is_a_configuration_error() -> None:
    with pytest.raises(SearchConfigError) as caught:
        configured(Settings(web_search_providers=["brave", "searxng", "bing"]))
    assert str(caught.value) == (
        "CLAWQ_WEB_SEARCH_PROVIDERS: brave is listed but CLAWQ_BRAVE_API_KEY is not set; "
        "searxng is listed but CLAWQ_SEARXNG_URL is not set; "
        "unknown search provider 'bing' (use brave, tavily, searxng, duckduckgo)"
    )
    assert configured(Settings()) == ["duckduckgo"]
    assert configured(Settings(tavily_api_key="k", searxng_url="http://s")) == [
        "tavily",
        "searxng",
        "duckduckgo",
    ]
