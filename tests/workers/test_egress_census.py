"""Every outbound request of every tool goes through the egress guard.

A census of the code: every call that opens a network client or a socket (httpx, httpx2,
requests, aiohttp, urllib, http.client, smtplib, socket, asyncio streams, websockets)
anywhere in the workers, and in the orchestrator's cron delivery, is one of the guard's
own (the egress client, the browser's proxy, the guarded connector of Edge's tts); and
the modules that send requests are the ones listed, each through the egress client. Then
two of them end to end: cron's webhook delivery and `image`'s URL download are refused
for a blocked address, and the server there hears nothing."""

from __future__ import annotations

import ast
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from broker.pg.store import Store
from broker.protocol import CallContext
from tests.conftest import Isolated
from tests.sites import Reply, Seen, Site
from workers.execute import run_tool
from workers.registry import default_registry
from workers.tool import ToolContext

ROOT = Path(__file__).resolve().parents[2]
SCANNED = [
    *sorted((ROOT / "workers").rglob("*.py")),
    ROOT / "orchestrator" / "services" / "cron.py",
]
# what opens a connection, by the dotted name it is called by
OPENERS = {
    "httpx": {"Client", "AsyncClient", "get", "post", "put", "patch", "delete", "head"}
    | {"request", "stream", "HTTPTransport", "AsyncHTTPTransport"},
    "httpx2": {"Client", "AsyncClient", "get", "post", "request", "stream"}
    | {"HTTPTransport", "AsyncHTTPTransport"},
    "httpcore": {"ConnectionPool", "AsyncConnectionPool", "SyncBackend", "AnyIOBackend"},
    "httpcore2": {"ConnectionPool", "AsyncConnectionPool", "SyncBackend", "AnyIOBackend"},
    "requests": {"get", "post", "put", "patch", "delete", "head", "request", "Session"},
    "aiohttp": {"ClientSession", "TCPConnector", "request"},
    "urllib.request": {"urlopen", "Request", "build_opener"},
    "http.client": {"HTTPConnection", "HTTPSConnection"},
    "smtplib": {"SMTP", "SMTP_SSL", "LMTP"},
    "socket": {"socket", "create_connection", "getaddrinfo"},
    "asyncio": {"open_connection", "create_connection", "create_datagram_endpoint"},
    "websockets": {"connect"},
    "edge_tts": {"Communicate"},
}
# the guard itself: where a connection is opened to an address that was checked
GUARD = {
    ("workers/egress/client.py", "httpx.Client"): "the egress client",
    ("workers/egress/client.py", "httpx.HTTPTransport"): "the egress client's transport",
    ("workers/egress/client.py", "httpcore.ConnectionPool"): "its pool, on the guarded backend",
    ("workers/egress/client.py", "httpcore.SyncBackend"): "connects to checked addresses only",
    ("workers/egress/client.py", "socket.getaddrinfo"): "the resolver whose answers are checked",
    ("workers/egress/async_client.py", "httpx2.AsyncClient"): "the async egress client (MCP)",
    ("workers/egress/async_client.py", "httpx2.AsyncHTTPTransport"): "its transport",
    ("workers/egress/async_client.py", "httpcore2.AsyncConnectionPool"): "its guarded pool",
    ("workers/egress/async_client.py", "httpcore2.AnyIOBackend"): "connects to checked addresses",
    ("workers/egress/proxy.py", "asyncio.open_connection"): "the browser's proxy, checked",
    ("workers/tools/media/tts.py", "aiohttp.TCPConnector"): "Edge's, on a checked resolver",
    ("workers/tools/media/tts.py", "edge_tts.Communicate"): "given the guarded connector",
    ("workers/tools/messaging/channels.py", "socket.create_connection"): "SMTP, checked",
}
# the modules that send requests, and what sends them: each through the egress client
REQUESTERS = {
    "workers/tools/web/fetch.py": "web_fetch",
    "workers/tools/web/search.py": "web_search",
    "workers/tools/web/providers.py": "web_search's providers",
    "workers/tools/media/providers.py": "image and tts (their endpoints, image URLs)",
    "workers/tools/media/tts.py": "tts (Edge's websocket: checked_addresses)",
    "workers/tools/messaging/channels.py": "message (webhook, Slack, Telegram; SMTP)",
    "workers/tools/memory/embed.py": "memory's OpenAI-compatible embeddings",
    "workers/tools/mcp/connection.py": "MCP servers over streamable HTTP and SSE",
    "workers/tools/mcp/oauth.py": "MCP servers' OAuth token endpoints (refresh)",
    "workers/egress/proxy.py": "browser pages (the per-session proxy)",
    "workers/egress/async_client.py": "the async egress client, on the sync one's checks",
    "orchestrator/services/cron.py": "cron's webhook delivery",
}


def dotted(node: ast.expr, aliases: dict[str, str]) -> str:
    """`httpx.Client` for `httpx.Client(...)`, through `import x as y` and `from x import y`."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def openers(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text())
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = (
                    a.name if a.asname else a.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = dotted(node.func, aliases)
            module, _, attr = name.rpartition(".")
            if attr in OPENERS.get(module, ()):
                yield name


SENDING = {"egress_for", "Egress", "checked_addresses", "client_factory"}  # not mere types
# library transports that make their own client unless given one of ours
TRANSPORTS = {
    "mcp.client.sse.sse_client": "httpx_client_factory",
    "mcp.client.streamable_http.streamable_http_client": "http_client",
}


def uses_egress(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(
        isinstance(node, ast.ImportFrom)
        and node.module in ("workers.egress.client", "workers.egress.async_client")
        and any(a.name in SENDING for a in node.names)
        for node in ast.walk(tree)
    )


def transports_without_our_client(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text())
    aliases = {
        a.asname or a.name: f"{node.module}.{a.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
        for a in node.names
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = aliases.get(node.func.id, "")
            needed = TRANSPORTS.get(name)
            if needed and needed not in {k.arg for k in node.keywords}:
                yield name


def test_every_connection_is_opened_by_the_guard() -> None:
    found = {(str(path.relative_to(ROOT)), name) for path in SCANNED for name in openers(path)}
    unguarded = sorted(found - set(GUARD))
    assert unguarded == [], f"outbound connections outside the egress guard: {unguarded}"
    assert ("workers/egress/client.py", "httpx.Client") in found  # the census sees what it should


def test_the_modules_that_send_requests_go_through_the_egress_client() -> None:
    senders = {str(p.relative_to(ROOT)) for p in SCANNED if uses_egress(p)}
    assert senders == set(REQUESTERS), sorted(senders)
    unguarded = [
        (str(p.relative_to(ROOT)), t) for p in SCANNED for t in transports_without_our_client(p)
    ]
    assert unguarded == [], f"library transports on their own HTTP client: {unguarded}"


@pytest.fixture
def victim() -> Iterator[Site]:
    """A server on loopback, not exempted: it must hear nothing."""
    with Site({"/": Reply(200, b"never"), "/hook": Reply(200, b"{}")}) as site:
        yield site


@pytest.fixture
def allowed() -> Iterator[Site]:
    with Site({"/hook": Reply(200, b"{}")}) as site:
        yield site


def test_cron_webhook_delivery_is_refused_for_a_blocked_address(
    isolated: Isolated, victim: Site, allowed: Site, caplog: pytest.LogCaptureFixture
) -> None:
    from orchestrator.services.cron import Ticker

    settings = isolated.settings.model_copy(update={"web_private_allow": [allowed.endpoint]})
    ticker = Ticker(settings, app=None)  # type: ignore[arg-type]  # delivery sends no task
    run = type("Run", (), {"scheduled_at": datetime(2026, 1, 1, tzinfo=UTC)})()
    row = {
        "name": "nightly",
        "delivery": "webhook",
        "job_status": "completed",
        "final_text": "all green",
        "job_error": "",
        "session_id": "",
        "origin_session": "",
    }
    with caplog.at_level(logging.WARNING, logger="orchestrator.services.cron"):
        ticker._deliver(run, {**row, "webhook_url": f"{victim.url}/hook"})
        ticker._deliver(run, {**row, "webhook_url": "http://metadata.google.internal/hook"})
        ticker._deliver(run, {**row, "webhook_url": f"{allowed.url}/hook"})
    assert victim.seen == []
    refusals = [r.getMessage() for r in caplog.records]
    assert any("url_not_allowed: 127.0.0.1, a loopback address" in m for m in refusals)
    assert any("metadata.google.internal is an internal host name" in m for m in refusals)
    (delivered,) = allowed.seen  # the same path delivers where the policy allows
    assert delivered.json()["text"] == "all green"


def test_an_image_url_on_a_blocked_address_is_not_downloaded(
    isolated: Isolated, victim: Site
) -> None:
    def generations(seen: Seen) -> Reply:
        data = [{"url": f"{victim.url}/"}]  # an image "hosted" on a blocked address
        return Reply(200, json.dumps({"created": 1, "data": data}).encode(), "application/json")

    with Site({"/v1/images/generations": generations}) as vendor:
        settings = isolated.settings.model_copy(
            update={
                "web_private_allow": [vendor.endpoint],
                "openai_base_url": f"{vendor.url}/v1",
                "openai_api_key": "sk-test-census-key-000000",
            }
        )
        store = Store(settings.database_url)
        try:
            ctx = ToolContext(
                CallContext(workspace="/tmp", user_id="ann"),
                settings,
                session_id="s",
                store=lambda: store,
            )
            result = run_tool(default_registry(), "image", {"prompt": "a red square"}, ctx)
        finally:
            store.close()
    assert result.is_error and "127.0.0.1, a loopback address" in result.for_llm, result.for_llm
    assert victim.seen == []
