"""Search providers behind web_search, each mapped to one result shape.

Brave (`/res/v1/web/search`, `X-Subscription-Token`), Tavily (`POST /search`, a bearer
key), SearXNG (`/search?format=json`, self-hosted, no key) and DuckDuckGo (its HTML
endpoint, parsed by the `ddgs` library, which is given our egress client instead of its
own). Every request goes through the guarded egress client. Each provider maps freshness,
country and language its own way and says which of them it could not honour.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import BaseModel

from broker.config.settings import Settings
from broker.errors import ConfigurationError, RunError
from workers.egress.client import Egress, Fetched
from workers.egress.netguard import EgressError

Freshness = Literal["day", "week", "month", "year"]
NAMES = ("brave", "tavily", "searxng", "duckduckgo")
TRACKING = ("utm_", "fbclid", "gclid", "mc_cid", "mc_eid", "ref_src")


class SearchConfigError(ConfigurationError, ValueError):
    """A provider is asked for but not configured: found at worker start, not at a call."""


class ProviderError(RunError):
    """One provider could not answer; the next is tried."""


class Query(BaseModel):
    query: str
    count: int = 5
    freshness: Freshness | None = None
    country: str | None = None
    language: str | None = None


class Hit(BaseModel):
    title: str
    url: str
    snippet: str = ""
    published: str = ""
    provider: str


@dataclass
class Answer:
    hits: list[Hit]
    unhonoured: list[str]  # the query's options this provider could not apply


def canonical(url: str) -> str:
    """The form two results of one page share: no fragment, no tracking parameters, a
    lower-case scheme and host, no default port, no trailing slash."""
    parts = urlsplit(url.strip())
    host = (parts.hostname or "").lower()
    default = {"http": 80, "https": 443}.get(parts.scheme.lower())
    netloc = host if parts.port in (None, default) else f"{host}:{parts.port}"
    kept = parse_qsl(parts.query, keep_blank_values=True)
    query = urlencode([(k, v) for k, v in kept if not k.startswith(TRACKING)])
    return urlunsplit((parts.scheme.lower(), netloc, parts.path.rstrip("/") or "/", query, ""))


def _json(fetched: Fetched, provider: str) -> Any:
    if fetched.status in (401, 403):
        raise ProviderError(f"the API key was refused (HTTP {fetched.status})")
    if fetched.status >= 400:
        raise ProviderError(f"HTTP {fetched.status}")
    try:
        return json.loads(fetched.body)
    except ValueError:
        raise ProviderError(f"{provider} did not answer JSON") from None


class Provider:
    name: ClassVar[str]

    def __init__(self, settings: Settings, egress: Egress) -> None:
        self.settings = settings
        self.egress = egress

    def search(self, q: Query) -> Answer:
        raise NotImplementedError


class Brave(Provider):
    name = "brave"
    FRESHNESS: ClassVar[dict[str, str]] = {"day": "pd", "week": "pw", "month": "pm", "year": "py"}

    def search(self, q: Query) -> Answer:
        params: dict[str, Any] = {"q": q.query, "count": q.count}
        if q.freshness:
            params["freshness"] = self.FRESHNESS[q.freshness]
        if q.country:
            params["country"] = q.country.upper()
        if q.language:
            params["search_lang"] = q.language.lower()
        fetched = self.egress.request(
            "GET",
            self.settings.brave_base_url.rstrip("/") + "/res/v1/web/search",
            params=params,
            headers={
                "Accept": "application/json",
                "X-Subscription-Token": self.settings.brave_api_key,
            },
        )
        data = _json(fetched, self.name)
        results = (data.get("web") or {}).get("results") or []
        hits = [
            Hit(
                title=r.get("title", ""),
                url=r["url"],
                snippet=r.get("description", ""),
                published=r.get("page_age") or r.get("age") or "",
                provider=self.name,
            )
            for r in results
            if r.get("url")
        ]
        return Answer(hits, [])


class Tavily(Provider):
    name = "tavily"

    def search(self, q: Query) -> Answer:
        body: dict[str, Any] = {"query": q.query, "max_results": q.count, "topic": "general"}
        if q.freshness:
            body["time_range"] = q.freshness
        fetched = self.egress.request(
            "POST",
            self.settings.tavily_base_url.rstrip("/") + "/search",
            json=body,
            headers={"Authorization": f"Bearer {self.settings.tavily_api_key}"},
        )
        data = _json(fetched, self.name)
        hits = [
            Hit(
                title=r.get("title", ""),
                url=r["url"],
                snippet=r.get("content", ""),
                published=r.get("published_date") or "",
                provider=self.name,
            )
            for r in data.get("results") or []
            if r.get("url")
        ]
        unhonoured = [n for n, v in (("country", q.country), ("language", q.language)) if v]
        return Answer(hits, unhonoured)


class SearXNG(Provider):
    name = "searxng"

    def search(self, q: Query) -> Answer:
        params: dict[str, Any] = {"q": q.query, "format": "json"}
        if q.freshness:
            params["time_range"] = q.freshness
        if q.language:
            params["language"] = (
                f"{q.language.lower()}-{q.country.upper()}" if q.country else q.language.lower()
            )
        fetched = self.egress.request(
            "GET", self.settings.searxng_url.rstrip("/") + "/search", params=params
        )
        if fetched.status == 403:
            raise ProviderError("the instance serves no JSON (enable it in search.formats)")
        data = _json(fetched, self.name)
        hits = [
            Hit(
                title=r.get("title", ""),
                url=r["url"],
                snippet=r.get("content", ""),
                published=r.get("publishedDate") or "",
                provider=self.name,
            )
            for r in data.get("results") or []
            if r.get("url")
        ][: q.count]
        unhonoured = ["country"] if q.country and not q.language else []
        return Answer(hits, unhonoured)


class DuckDuckGo(Provider):
    name = "duckduckgo"
    TIMELIMIT: ClassVar[dict[str, str]] = {"day": "d", "week": "w", "month": "m", "year": "y"}

    def search(self, q: Query) -> Answer:
        from ddgs.engines.duckduckgo import Duckduckgo

        egress, url = self.egress, self.settings.duckduckgo_url

        class Engine(Duckduckgo):  # ddgs's payload and parsing, our egress client
            search_url = url

            def __init__(self) -> None:  # no client of its own
                pass

            def request(self, method: str, target: str, **kwargs: Any) -> str | None:
                fetched = egress.request(method, target, **kwargs)
                if fetched.status >= 400:
                    raise ProviderError(f"HTTP {fetched.status}")
                return fetched.body.decode(fetched.charset or "utf-8", errors="replace")

        region = "wt-wt"
        if q.country or q.language:
            region = f"{(q.country or 'wt').lower()}-{(q.language or 'en').lower()}"
        found = Engine().search(
            q.query, region=region, timelimit=self.TIMELIMIT[q.freshness] if q.freshness else None
        )
        hits = [
            Hit(title=r.title, url=r.href, snippet=r.body, provider=self.name)
            for r in (found or [])
            if r.href
        ][: q.count]
        return Answer(hits, [])


PROVIDERS: dict[str, type[Provider]] = {
    "brave": Brave,
    "tavily": Tavily,
    "searxng": SearXNG,
    "duckduckgo": DuckDuckGo,
}
NEEDS = {"brave": "brave_api_key", "tavily": "tavily_api_key", "searxng": "searxng_url"}


def configured(settings: Settings) -> list[str]:
    """The providers to try, in order: the setting's list (each must be configured: a
    missing key is a configuration error), or every configured one, DuckDuckGo last."""
    if not settings.web_search_providers:
        return [n for n in NAMES if n not in NEEDS or getattr(settings, NEEDS[n])]
    problems = []
    for name in settings.web_search_providers:
        if name not in PROVIDERS:
            problems.append(f"unknown search provider '{name}' (use {', '.join(NAMES)})")
        elif name in NEEDS and not getattr(settings, NEEDS[name]):
            problems.append(f"{name} is listed but CLAWQ_{NEEDS[name].upper()} is not set")
    if problems:
        raise SearchConfigError("CLAWQ_WEB_SEARCH_PROVIDERS: " + "; ".join(problems))
    return list(settings.web_search_providers)


def failure(exc: Exception) -> str:
    """One provider's failure in a few words, for the combined error."""
    if isinstance(exc, EgressError):
        return exc.reason
    return str(exc) or type(exc).__name__
