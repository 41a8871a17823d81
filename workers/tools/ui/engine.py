"""One Chromium per ui worker process, driven by Playwright's async API on an event loop
thread of its own; a browser context per session, closed when idle or too old.

Tool calls arrive on the worker's pool threads and run their coroutine on that loop
(`Engine.call`), so sessions of many jobs share one browser without sharing state.
Every request of every page is judged twice: at the route (scheme, host, domain lists,
an address written in the URL) and at connect time by the local egress proxy (the
addresses Chromium would reach). Both ask for the policy in force when the request is
made: a live change reaches the pages already open (`configure`, told by `workers.live`).
WebRTC may send no UDP that bypasses the proxy, so STUN and TURN cannot reach around it.
A canvas render runs no script and reaches nothing: every request is refused, and what
connects without a request (a preconnect) meets a proxy that refuses everything.
A download belongs to the session whose page made it: each session keeps its owner and
the function that stores its downloads, never one shared by the whole process."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from broker.config.settings import Settings
from workers import live
from workers.egress.client import Resolver
from workers.egress.netguard import EgressError, EgressPolicy, check_target, parse_url
from workers.egress.proxy import EgressProxy
from workers.tool import ToolError

log = logging.getLogger(__name__)
T = TypeVar("T")

# what a page may load besides http(s): its own inline data, never local files or internals
INLINE_SCHEMES = ("data:", "blob:", "about:")
VIEWPORT = {"width": 1280, "height": 800}
# WebRTC sends UDP only through a proxy, and ours takes none: no STUN or TURN around it
WEBRTC_POLICY = "disable_non_proxied_udp"


@dataclass
class Tab:
    page: Any
    last_snapshot: list[str] = field(default_factory=list)
    console: deque[str] = field(default_factory=lambda: deque(maxlen=100))


@dataclass(frozen=True)
class Owner:
    """Whom a browser session acts for: the user and session that opened it, and the job
    that acted on it last. Its downloads become their artifacts."""

    user_id: str
    session_id: str
    job_id: str


# stores one download for its owner: (owner, file name, bytes, mime) -> what the model is told
Keep = Callable[[Owner, str, bytes, str], str]


@dataclass
class Session:
    context: Any
    tabs: list[Tab]
    owner: Owner
    keep: Keep
    current: int = 0
    created: float = field(default_factory=time.monotonic)
    used: float = field(default_factory=time.monotonic)
    blocked: deque[str] = field(default_factory=lambda: deque(maxlen=20))
    downloads: list[str] = field(default_factory=list)  # artifact descriptions
    proxy: EgressProxy | None = None

    @property
    def tab(self) -> Tab:
        return self.tabs[self.current]


class Engine:
    def __init__(self, settings: Settings, resolver: Resolver | None = None) -> None:
        self.settings = settings
        self.policy = EgressPolicy.from_settings(settings)
        self.resolver = resolver  # the proxies' name resolver (None: the system's)
        self.nowhere = EgressProxy(lambda: None)  # where a canvas render's sockets go
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="browser", daemon=True)
        self.thread.start()
        self.sessions: dict[str, Session] = {}
        self.browser: Any = None
        self.playwright: Any = None
        self.reaper: asyncio.Task[None] | None = None
        self.call(self._start(), timeout=60)
        live.subscribe(self.configure)

    def configure(self, settings: Settings) -> None:
        """The settings now in force: routes and proxies of every open session ask for
        `self.policy` at each request, so the next one already follows them."""
        self.settings = settings
        self.policy = EgressPolicy.from_settings(settings)

    def call(self, coro: Awaitable[T], timeout: float | None = None) -> T:
        """Run `coro` on the browser's loop; a pool thread waits at most `timeout`."""
        limit = timeout or self.settings.browser_action_timeout_s
        future = asyncio.run_coroutine_threadsafe(_ensure(coro), self.loop)
        try:
            return future.result(limit + 2)
        except TimeoutError:
            future.cancel()
            raise ToolError(f"the browser did not answer within {limit:.0f} s") from None

    async def _start(self) -> None:
        from playwright.async_api import async_playwright

        self.playwright = await async_playwright().start()
        executable = self.settings.browser_executable
        if not Path(executable).exists():
            raise ToolError(f"no Chromium at {executable} (CLAWQ_BROWSER_EXECUTABLE)")
        self.browser = await self.playwright.chromium.launch(
            executable_path=executable,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-features=AutofillServerCommunication,OptimizationHints,Translate",
                f"--webrtc-ip-handling-policy={WEBRTC_POLICY}",
            ],
        )
        await self.nowhere.start()
        self.reaper = self.loop.create_task(self._reap())

    async def _reap(self) -> None:
        """Close sessions idle for `browser_idle_s` or older than `browser_session_max_s`."""
        while True:
            await asyncio.sleep(min(30.0, self.settings.browser_idle_s / 4))
            now = time.monotonic()
            for key, session in list(self.sessions.items()):
                idle = now - session.used > self.settings.browser_idle_s
                old = now - session.created > self.settings.browser_session_max_s
                if idle or old:
                    await self.close(key)

    async def session(self, owner: Owner, keep: Keep, create: bool) -> Session | None:
        """The browser session of `owner.session_id` (made when `create`). Each call names
        its owner, so the session's downloads are stored for the job acting on it now; a
        session never serves another user, whatever its id."""
        key = owner.session_id
        found = self.sessions.get(key)
        if found is not None and found.owner.user_id != owner.user_id:
            raise ToolError("this browser session belongs to another user")
        if found is None and create:
            blocked: deque[str] = deque(maxlen=20)
            # a proxy per session: what it refuses is told to this session only
            proxy = EgressProxy(
                lambda: self.policy,
                lambda host, why: blocked.append(f"{host}: {why}"),
                self.resolver,
            )
            await proxy.start()
            context = await self.browser.new_context(
                viewport=VIEWPORT,
                accept_downloads=True,
                proxy={"server": proxy.url},
                service_workers="block",
            )
            context.set_default_timeout(self.settings.browser_action_timeout_s * 1000)
            found = Session(context, [], owner, keep, proxy=proxy, blocked=blocked)
            await context.route("**/*", lambda route: self._route(found, route))
            self.sessions[key] = found
            await self.open_tab(found)
        if found is not None:
            found.used = time.monotonic()
            found.owner, found.keep = owner, keep
        return found

    async def _route(self, session: Session | None, route: Any) -> None:
        url = route.request.url
        if url.startswith(INLINE_SCHEMES):
            await route.continue_()
            return
        try:
            check_target(parse_url(url), self.policy)  # literal addresses as the proxy would
        except EgressError as exc:
            if session is not None:
                session.blocked.append(f"{url[:200]}: {exc.reason}")
            await route.abort("blockedbyclient")
            return
        await route.continue_()

    async def open_tab(self, session: Session, url: str | None = None) -> Tab:
        if len(session.tabs) >= self.settings.browser_max_tabs:
            raise ToolError(
                f"{self.settings.browser_max_tabs} tabs are open; close one (tabs close)"
            )
        page = await session.context.new_page()
        tab = Tab(page=page)
        page.on("console", lambda msg: tab.console.append(f"[{msg.type}] {msg.text}"[:500]))
        page.on("download", lambda d: asyncio.ensure_future(self._download(session, d)))
        session.tabs.append(tab)
        session.current = len(session.tabs) - 1
        if url:
            await page.goto(url)
        return tab

    async def _download(self, session: Session, download: Any) -> None:
        """Downloads go to the quarantine directory, then become artifacts of the session
        whose page started them (its owner when the download began: a later job of the
        session, or another session's call, does not change whose it is). Stored on a
        thread, so the browser's loop never waits on the database."""
        owner, keep = session.owner, session.keep
        quarantine = Path(self.settings.browser_download_dir)
        quarantine.mkdir(parents=True, exist_ok=True)
        target = quarantine / f"{time.time_ns()}-{Path(download.suggested_filename).name}"
        try:
            await download.save_as(str(target))
            data = target.read_bytes()
            name, mime = download.suggested_filename, "application/octet-stream"
            session.downloads.append(await asyncio.to_thread(keep, owner, name, data, mime))
        except Exception as exc:
            session.downloads.append(f"download {download.suggested_filename} failed: {exc}")
        finally:
            target.unlink(missing_ok=True)

    async def close(self, key: str) -> bool:
        session = self.sessions.pop(key, None)
        if session is None:
            return False
        try:
            await session.context.close()
        except Exception as exc:
            log.warning("closing browser session %s: %s", key, exc)
        if session.proxy is not None:
            await session.proxy.stop()
        return True

    async def render(self, html: str) -> bytes:
        """A screenshot of `html` in a context that runs no script and can reach nothing:
        every request is refused at the route, and a socket opened without one (a
        preconnect) goes to a proxy that refuses everything."""
        context = await self.browser.new_context(
            viewport=VIEWPORT,
            offline=True,
            java_script_enabled=False,
            service_workers="block",
            proxy={"server": self.nowhere.url},
        )
        try:
            await context.route(
                "**/*",
                lambda route: (
                    route.continue_()  # the document's own inline data is not the network
                    if route.request.url.startswith(INLINE_SCHEMES)
                    else route.abort("blockedbyclient")
                ),
            )
            page = await context.new_page()
            await page.set_content(html or "<!doctype html><title>empty</title>")
            return bytes(await page.screenshot(type="png", full_page=True))
        finally:
            await context.close()

    def stop(self) -> None:
        """Close every session and the browser, then the loop itself (its thread ends)."""

        async def _stop() -> None:
            if self.reaper is not None:
                self.reaper.cancel()
            for key in list(self.sessions):
                await self.close(key)
            await self.nowhere.stop()
            if self.browser is not None:
                await self.browser.close()
            if self.playwright is not None:
                await self.playwright.stop()

        live.unsubscribe(self.configure)
        try:
            self.call(_stop(), timeout=20)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
            if not self.thread.is_alive():
                self.loop.close()


async def _ensure(coro: Awaitable[T]) -> T:
    return await coro


_engine: Engine | None = None
_engine_lock = threading.Lock()


def engine_for_process(settings: Settings) -> Engine:
    global _engine
    with _engine_lock:
        if _engine is None:
            _engine = Engine(settings)
        elif _engine.settings is not settings:  # a call brings the settings in force
            _engine.configure(settings)
        return _engine
