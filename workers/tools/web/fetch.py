"""web_fetch: a URL's content as Markdown or text, through the guarded egress client.

The whole extracted text is cached in Redis (15 min, shared by every web worker), keyed
by the URL and the mode, so paging with `start_index` reuses it. The policy in force (the
live domain lists) is checked before the cache, for the URL and for where it led, so a
domain blocked since is never served from it. The result is wrapped as
untrusted content and says where it came from, what extracted it, and whether more
remains. Permission is asked per domain: "allow always" stores `web_fetch(domain:host)`.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import httpx
from pydantic import Field

from broker.protocol import Group
from workers.egress.netguard import (
    EgressError,
    EgressPolicy,
    check_target,
    check_url,
    domain_matches,
    parse_url,
)
from workers.tool import (
    Permission,
    RuleKind,
    SideEffect,
    Tool,
    ToolContext,
    ToolInput,
    ToolResult,
)

ACCEPT = (
    "text/markdown, text/html;q=0.9, application/xhtml+xml;q=0.9, application/json;q=0.8, "
    "application/pdf;q=0.7, text/plain;q=0.6, */*;q=0.1"
)


class WebFetchInput(ToolInput):
    url: str = Field(description="http(s) URL to read")
    extract_mode: Literal["markdown", "text"] = Field(
        "markdown", description="markdown keeps links and structure; text is plain"
    )
    max_chars: int = Field(20_000, ge=100, description="at most this many characters back")
    start_index: int = Field(0, ge=0, description="where to start: page on with the next index")


def host_of(url: str) -> str:
    try:
        return httpx.URL(url.strip()).host.lower().rstrip(".")
    except httpx.InvalidURL:
        return ""


class WebFetch(Tool[WebFetchInput]):
    name = "web_fetch"
    description = (
        "Fetch a URL and return its content as Markdown (or text): HTML pages, Markdown, "
        "JSON and PDF. Long content comes in pages: call again with start_index. "
        "Internal and private addresses are not reachable."
    )
    group = Group.web
    input_model = WebFetchInput
    side_effect = SideEffect.read
    uses_egress = True
    default_permission = "ask"
    timeout_s = 60.0

    def summary(self, args: WebFetchInput) -> str:
        return f"web_fetch({args.url[:100]})"

    def concurrency_safe(self, args: WebFetchInput) -> bool:
        return True

    def rule_matches(
        self, specifier: str, args: WebFetchInput, workspace: str, kind: RuleKind
    ) -> bool:
        """`web_fetch(domain:example.com)` covers the host and its subdomains."""
        if not specifier.startswith("domain:"):
            return kind != "allow"
        host = host_of(args.url)
        return bool(host) and domain_matches(host, specifier[7:].strip().lower())

    def rules_for(self, args: WebFetchInput, workspace: str) -> list[str]:
        host = host_of(args.url)
        return [f"web_fetch(domain:{host})"] if host else [self.name]

    def permission_check(
        self, args: WebFetchInput, workspace: str
    ) -> tuple[Permission, str] | None:
        """A URL that can never be fetched is refused here (the worker checks the rest:
        the configured lists and limits, and every address it would connect to)."""
        try:
            check_url(parse_url(args.url), EgressPolicy())
        except EgressError as exc:
            return "deny", f"web_fetch refused ({exc.code}): {exc.reason}"
        return None

    def run(self, args: WebFetchInput, ctx: ToolContext) -> ToolResult:
        from workers.egress.client import egress_for
        from workers.tools.web.extract import extract
        from workers.tools.web.shared import cache_get, cache_key, cache_put

        settings = ctx.settings
        key = cache_key("fetch", args.url.strip(), args.extract_mode)
        policy = EgressPolicy.from_settings(settings)  # the live lists, before the cache
        try:
            check_target(parse_url(args.url), policy)
            page: dict[str, Any] | None = cache_get(ctx.redis, key)
            if page is not None:  # where it was read from may have been blocked since
                check_target(parse_url(page["final_url"]), policy)
        except EgressError as exc:
            return ToolResult.error(f"web_fetch refused ({exc.code}): {exc.reason}", code=exc.code)
        cached = page is not None
        if page is None:
            try:
                fetched = egress_for(settings).request("GET", args.url, headers={"Accept": ACCEPT})
                if fetched.status >= 400:
                    raise EgressError(
                        "url_not_accessible", f"{fetched.url} answered HTTP {fetched.status}"
                    )
                got = extract(
                    fetched.body,
                    fetched.content_type,
                    fetched.charset,
                    fetched.url,
                    args.extract_mode,
                )
            except EgressError as exc:
                return ToolResult.error(
                    f"web_fetch refused ({exc.code}): {exc.reason}", code=exc.code
                )
            page = {
                "final_url": fetched.url,
                "status": fetched.status,
                "content_type": fetched.content_type,
                "title": got.title,
                "extractor": got.extractor,
                "text": got.text,
                "note": got.note,
                "body_truncated": fetched.truncated,
                "fetched_at": time.time(),
            }
            cache_put(ctx.redis, key, page, settings.web_cache_ttl_s)
        return _result(args, page, min(args.max_chars, settings.web_fetch_max_chars), cached)


def _result(args: WebFetchInput, page: dict[str, Any], limit: int, cached: bool) -> ToolResult:
    from workers.untrusted import wrap

    text: str = page["text"]
    chunk = text[args.start_index : args.start_index + limit]
    end = args.start_index + len(chunk)
    notes = []
    if page["note"]:
        notes.append(f"[note: {page['note']}]")
    if page["body_truncated"]:
        notes.append("[the response was larger than the size cap; what follows is its start]")
    if end < len(text):
        notes.append(f"[{len(text) - end} more characters: call again with start_index={end}]")
    elif args.start_index >= len(text) and text:
        notes.append(f"[start_index {args.start_index} is past the end ({len(text)} characters)]")
    header = f"{page['title']}\n\n" if page["title"] and args.start_index == 0 else ""
    body = wrap(page["final_url"], header + chunk) + ("\n" + "\n".join(notes) if notes else "")
    return ToolResult(
        for_llm=body,
        for_user=f"fetched {page['final_url']} ({page['status']}, {len(text)} characters)",
        metadata={
            "final_url": page["final_url"],
            "status": page["status"],
            "content_type": page["content_type"],
            "title": page["title"],
            "extractor": page["extractor"],
            "truncated": end < len(text) or page["body_truncated"],
            "total_length": len(text),
            "start_index": args.start_index,
            "fetched_at": page["fetched_at"],
            "cached": cached,
        },
    )
