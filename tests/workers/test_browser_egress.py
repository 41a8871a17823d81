"""The browser's network, with real Chromium (Debian's, through Playwright) against local
servers: WebRTC (STUN, TURN over UDP and over TCP) reaches no blocked port; HTTPS and wss
from pages meet the proxy's CONNECT check for addresses and names; the route refuses an
address written in the URL; a live policy change reaches a page already open; and the
canvas snapshot runs no script and reaches nothing. Every listener here is on loopback,
which the policy blocks: a packet or a connection that arrives is a leak."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from broker.config.settings import Settings
from broker.pg.store import Store
from broker.protocol import CallContext
from tests.conftest import Isolated
from tests.sites import Reply, Site
from workers import live
from workers.egress.netguard import EgressError, EgressPolicy, parse_private_allow
from workers.egress.proxy import EgressProxy
from workers.execute import run_tool
from workers.registry import default_registry
from workers.tool import ToolContext, ToolResult
from workers.tools.ui import engine as ui_engine

REGISTRY = default_registry()


class Listener:
    """A TCP port on loopback that counts the connections it is offered."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.1)
        self.port: int = self.server.getsockname()[1]
        self.connections = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(2)
        self.server.close()


class Datagrams:
    """A UDP port on loopback that keeps what arrives."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port: int = self.sock.getsockname()[1]

    def received(self) -> int:
        count = 0
        while True:
            try:
                self.sock.recvfrom(4096)
            except OSError:
                return count
            count += 1

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def victim() -> Iterator[Listener]:
    listener = Listener()
    yield listener
    listener.close()


@pytest.fixture
def udp() -> Iterator[Datagrams]:
    ports = Datagrams()
    yield ports
    ports.close()


def rtc_script(udp_port: int, tcp_port: int) -> str:
    """ICE gathering against a STUN server, a TURN server over UDP and one over TCP, all
    on blocked loopback ports; the title says when gathering is over."""
    return f"""
    const pc = new RTCPeerConnection({{iceServers: [
      {{urls: 'stun:127.0.0.1:{udp_port}'}},
      {{urls: 'turn:127.0.0.1:{udp_port}?transport=udp', username: 'u', credential: 'p'}},
      {{urls: 'turn:127.0.0.1:{tcp_port}?transport=tcp', username: 'u', credential: 'p'}}]}});
    pc.createDataChannel('x');
    pc.createOffer().then(o => pc.setLocalDescription(o));
    setTimeout(() => {{ document.title = 'gathered'; }}, 3000);
    """


def page(body: str, script: str = "") -> Reply:
    html = f"<!doctype html><title>loading</title><body>{body}<script>{script}</script></body>"
    return Reply(body=html.encode(), content_type="text/html")


NAMES = {"ferry.test", "rebind.test"}  # both are loopback; only the site's port is exempt


def resolver(host: str, port: int) -> list[str]:
    if host in NAMES:
        return ["127.0.0.1"]
    raise EgressError("url_not_accessible", f"{host} does not resolve")


class Browser:
    """One ui worker process's engine, called as the worker calls the tools."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engine = ui_engine.Engine(settings, resolver=resolver)
        self.store = Store(settings.database_url)
        self.redis = redis.Redis.from_url(settings.redis_url)

    def tool(self, name: str, session: str, **args: Any) -> ToolResult:
        ctx = ToolContext(
            CallContext(workspace="/tmp", user_id="ann"),
            self.engine.settings,
            job_id="job-1",
            call_id=uuid.uuid4().hex,
            session_id=session,
            store=lambda: self.store,
            redis=self.redis,
            proc_id="proc:test:1",
        )
        return run_tool(REGISTRY, name, args, ctx)

    def evaluate(self, session: str, expression: str) -> Any:
        page = self.engine.sessions[session].tab.page
        return self.engine.call(page.evaluate(expression))

    def blocked(self, session: str) -> list[str]:
        return list(self.engine.sessions[session].blocked)

    def close(self) -> None:
        self.engine.stop()
        self.redis.close()
        self.store.close()


@pytest.fixture
def site() -> Iterator[Site]:
    with Site({"/data": Reply(body=b"fresh data")}) as s:
        yield s


@pytest.fixture
def browser(isolated: Isolated, site: Site, monkeypatch: pytest.MonkeyPatch) -> Iterator[Browser]:
    settings = isolated.settings.model_copy(update={"web_private_allow": [site.endpoint]})
    found = Browser(settings)
    monkeypatch.setattr(ui_engine, "_engine", found.engine)  # this process's one browser
    try:
        yield found
    finally:
        found.close()


def wait_for(what: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := what():
            return found
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


def test_webrtc_sends_nothing_around_the_proxy(
    browser: Browser, site: Site, victim: Listener, udp: Datagrams
) -> None:
    site.routes["/rtc"] = page("<p>calling</p>", rtc_script(udp.port, victim.port))
    opened = browser.tool("browser", "s-rtc", action="navigate", url=f"{site.url}/rtc")
    assert not opened.is_error, opened.for_llm
    gathered = browser.tool("browser", "s-rtc", action="wait_for", text="calling")
    assert not gathered.is_error, gathered.for_llm
    wait_for(lambda: browser.evaluate("s-rtc", "document.title") == "gathered")
    time.sleep(0.5)  # stragglers
    assert udp.received() == 0  # no STUN binding, no TURN allocation over UDP
    assert victim.connections == 0  # TURN over TCP went to the proxy, which refused it


def connect(proxy_port: int, target: str) -> bytes:
    """A CONNECT through the proxy; what it answered."""
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=5) as conn:
        conn.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        return conn.recv(4096)


def test_connect_is_refused_for_blocked_addresses_and_names(site: Site, victim: Listener) -> None:
    """CONNECT (what HTTPS and wss are to a proxy) to loopback written every way, and to
    names that resolve there; the site's own endpoint, exempted, tunnels."""
    networks, endpoints = parse_private_allow([site.endpoint])
    policy = EgressPolicy(private_networks=networks, private_endpoints=endpoints)
    blocked: list[str] = []

    async def scenario() -> tuple[list[bytes], bytes]:
        proxy = EgressProxy(policy, lambda host, why: blocked.append(f"{host}: {why}"), resolver)
        await proxy.start()
        try:
            refused = [
                await asyncio.to_thread(connect, proxy.port, target)
                for target in (
                    f"127.0.0.1:{victim.port}",
                    f"[::1]:{victim.port}",
                    f"[::ffff:127.0.0.1]:{victim.port}",
                    f"2130706433:{victim.port}",
                    f"localhost:{victim.port}",
                    f"rebind.test:{victim.port}",
                    f"nowhere.test:{victim.port}",
                )
            ]
            tunnel = await asyncio.to_thread(tunnel_get, proxy.port, f"ferry.test:{site.port}")
            return refused, tunnel
        finally:
            await proxy.stop()

    refused, tunnel = asyncio.run(scenario())
    assert all(r.startswith(b"HTTP/1.1 403") for r in refused), refused
    assert victim.connections == 0
    assert "rebind.test: rebind.test resolves to 127.0.0.1, a loopback address" in blocked
    assert tunnel.endswith(b"fresh data")  # an allowed CONNECT carries bytes both ways


def tunnel_get(proxy_port: int, target: str) -> bytes:
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=5) as conn:
        conn.sendall(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
        assert conn.recv(4096).startswith(b"HTTP/1.1 200")
        conn.sendall(b"GET /data HTTP/1.1\r\nHost: ferry.test\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := conn.recv(4096):
            data += chunk
        return data


def test_https_and_wss_from_a_page_meet_the_proxy(
    browser: Browser, site: Site, victim: Listener
) -> None:
    """The route sees no WebSocket, and a name is only resolved at the proxy: both are
    the CONNECT check's to refuse."""
    site.routes["/reach"] = page("<p>reaching</p>")
    url = f"http://ferry.test:{site.port}/reach"
    opened = browser.tool("browser", "s-ws", action="navigate", url=url)
    assert not opened.is_error, opened.for_llm
    port = victim.port
    for target in (f"https://rebind.test:{port}/x", f"https://127.0.0.1:{port}/x"):
        fetched = f"fetch('{target}').then(r => 'ok').catch(e => 'failed')"
        assert browser.evaluate("s-ws", fetched) == "failed", target
    for target in (
        f"wss://127.0.0.1:{port}/",
        f"wss://rebind.test:{port}/",
        f"ws://127.0.0.1:{port}/",
        f"wss://[::1]:{port}/",
    ):
        socket_ = (
            f"new Promise(done => {{ const w = new WebSocket('{target}');"
            " w.onopen = () => done('open'); w.onerror = () => done('failed'); })"
        )
        assert browser.evaluate("s-ws", socket_) == "failed", target
    blocked = browser.blocked("s-ws")
    assert victim.connections == 0
    assert blocked.count("rebind.test: rebind.test resolves to 127.0.0.1, a loopback address") == 2
    assert f"https://127.0.0.1:{port}/x: 127.0.0.1, a loopback address" in blocked  # the route
    # the WebSockets, which no route sees, were refused at CONNECT by the proxy
    assert blocked.count("127.0.0.1: 127.0.0.1, a loopback address") == 2, blocked
    assert "::1: ::1, a loopback address" in blocked, blocked


def refusals(result: ToolResult) -> list[str]:
    """What a browser result says the egress policy blocked."""
    marker = "blocked by the egress policy: "
    for line in result.for_llm.splitlines():
        if line.startswith(marker):
            return line[len(marker) :].split("; ")
    return []


def test_the_route_refuses_an_address_written_in_the_url(
    browser: Browser, site: Site, victim: Listener
) -> None:
    """Loopback written as an address is refused where the request is made, before the
    proxy hears of it (the proxy's own refusals name the host alone)."""
    urls = [
        f"http://127.0.0.1:{victim.port}/a.png",
        f"http://127.0.0.2:{victim.port}/b.png",
        f"http://[::1]:{victim.port}/c.png",
    ]
    site.routes["/images"] = page("".join(f'<img src="{u}">' for u in urls))
    opened = browser.tool("browser", "s-img", action="navigate", url=f"{site.url}/images")
    assert not opened.is_error, opened.for_llm
    blocked = refusals(opened) + browser.blocked("s-img")
    assert sorted(blocked) == sorted(
        [
            f"{urls[0]}: 127.0.0.1, a loopback address",
            f"{urls[1]}: 127.0.0.2, a loopback address",
            f"{urls[2]}: ::1, a loopback address",
        ]
    ), blocked
    assert victim.connections == 0


def test_a_live_change_reaches_a_page_already_open(browser: Browser, site: Site) -> None:
    site.routes["/app"] = page("<p>app</p>")
    url = f"http://ferry.test:{site.port}/app"
    opened = browser.tool("browser", "s-live", action="navigate", url=url)
    assert not opened.is_error, opened.for_llm
    fetch = "fetch('/data').then(r => r.text()).catch(e => 'refused: ' + e.message)"
    assert browser.evaluate("s-live", fetch) == "fresh data"
    proxy = browser.engine.sessions["s-live"].proxy
    assert proxy is not None
    assert connect(proxy.port, f"ferry.test:{site.port}").startswith(b"HTTP/1.1 200")

    from broker.config.live import effective

    # what the worker's runtime does when `clawq config apply` blocks the domain
    live.changed(effective(browser.settings, {"web_block_domains": ["ferry.test"]}))
    assert browser.evaluate("s-live", fetch).startswith("refused: ")
    assert site.paths().count("/data") == 1  # the second fetch reached nobody
    assert connect(proxy.port, f"ferry.test:{site.port}").startswith(b"HTTP/1.1 403")
    assert any("ferry.test is on the blocked domain list" in b for b in browser.blocked("s-live"))


def test_the_canvas_snapshot_runs_no_script_and_reaches_nothing(
    browser: Browser, site: Site, victim: Listener, udp: Datagrams
) -> None:
    here, there = site.url, f"http://127.0.0.1:{victim.port}"
    canvas = f"""<!doctype html><html><head>
    <meta http-equiv="refresh" content="0;url={here}/refresh">
    <link rel="stylesheet" href="{here}/style.css">
    <link rel="preconnect" href="{there}">
    <link rel="prefetch" href="{here}/prefetch">
    <script src="{here}/script.js"></script>
    </head><body><h1>Report</h1>
    <img src="{here}/img.png"><img src="{there}/img.png">
    <iframe src="{here}/frame"></iframe>
    <object data="{here}/object"></object>
    <script>
      fetch('{here}/fetch'); new Image().src = '{here}/js-image';
      new WebSocket('ws://127.0.0.1:{victim.port}/');
      {rtc_script(udp.port, victim.port)}
    </script>
    <img src="data:image/gif;base64,R0lGODlhAQABAAAAACw=">
    </body></html>"""
    shown = browser.tool("canvas", "s-canvas", action="present", content=canvas, format="html")
    assert not shown.is_error, shown.for_llm
    snap = browser.tool("canvas", "s-canvas", action="snapshot")
    assert not snap.is_error and "artifact" in snap.for_llm, snap.for_llm
    time.sleep(3.5)  # as long as the page's own WebRTC would have gathered
    assert site.paths() == []  # not the script, the styles, the images, the frame, ...
    assert victim.connections == 0  # nor the preconnect, the WebSocket or TURN over TCP
    assert udp.received() == 0  # nor STUN or TURN over UDP
