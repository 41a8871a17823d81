"""The browser's parts: snapshots cut to what can be acted on, capped with a marker,
diffed against the previous one; the connect-time egress proxy, on real sockets; and
whose artifact a download becomes, with real Chromium, PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from broker.pg.store import Store
from broker.protocol import CallContext
from tests.conftest import Isolated
from tests.sites import Reply, Seen, Site
from workers.egress.netguard import EgressPolicy, parse_private_allow
from workers.egress.proxy import EgressProxy
from workers.execute import run_tool
from workers.registry import default_registry
from workers.tool import ToolContext, ToolResult
from workers.tools.ui import engine as ui_engine
from workers.tools.ui import snapshot as snap

TREE = """- generic [ref=e1]:
  - heading "Signup" [level=1] [ref=e2]
  - paragraph [ref=e3]:
    - text: Outside the form
    - link "Other page" [ref=e4] [cursor=pointer]:
      - /url: /other
  - generic [ref=e5]:
    - textbox "Name" [active] [ref=e6]
    - combobox "Color" [ref=e9]:
      - option "red" [selected]
    - button "Submit" [ref=e10]"""


def test_interactive_lines_keep_refs_and_drop_structure() -> None:
    assert snap.lines_of(TREE, interactive=True) == [
        '- heading "Signup" [level=1] [ref=e2]',
        '- link "Other page" [ref=e4]',  # no [cursor=pointer]: how it looks
        '- textbox "Name" [ref=e6]',
        '- combobox "Color" [ref=e9]',
        '- option "red" [selected]',
        '- button "Submit" [ref=e10]',
    ]
    assert len(snap.lines_of(TREE, interactive=False)) == len(TREE.splitlines())


LIST_PAGE = (
    "<!doctype html><html><head><title>Releases</title></head><body><h1>Releases</h1>"
    "<nav><a href='/'>Home</a> <a href='/about'>About</a></nav><ul>"
    + "".join(
        f'<li class="row"><a class="title" href="/r/{i}">Release {i}</a>'
        f' <span class="meta">{i * 3} downloads</span></li>'
        for i in range(300)
    )
    + "</ul></body></html>"
)


def test_a_long_list_page_snapshot_is_what_can_be_acted_on() -> None:
    """Issue 30: every link line ended in ` [cursor=pointer]`. On a 300-row list page in
    real Chromium, no presentation is left and the snapshot is under a third of the page's
    HTML (it was 46%)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            page = chromium.new_page()
            page.set_content(LIST_PAGE)
            page.locator("a").first.focus()
            tree = page.aria_snapshot(mode="ai")
        finally:
            chromium.close()
    assert "[cursor=pointer]" in tree and "[active]" in tree  # what Playwright gives
    shown = "\n".join(snap.lines_of(tree, interactive=True))
    whole = "\n".join(snap.lines_of(tree, interactive=False))
    for text in (shown, whole):
        assert "[cursor=" not in text and "[active]" not in text
    assert shown.count("\n- link ") == 302 and '- link "Release 299" [ref=' in shown
    assert len(shown) / len(LIST_PAGE) < 0.35, f"{len(shown)} of {len(LIST_PAGE)}"  # was 46%


def test_a_long_snapshot_is_cut_at_a_line_with_a_marker() -> None:
    lines = [f'- link "page {i}" [ref=e{i}]' for i in range(200)]
    text = snap.cap(lines, 500)
    body, marker = text.rsplit("\n", 1)
    assert len(body) <= 500 and body.endswith("]") and marker.startswith("[snapshot cut at")


def test_a_diff_names_only_what_changed() -> None:
    before = ['- textbox "Name" [ref=e6]', '- button "Go" [ref=e7]']
    after = ['- textbox "Name" [ref=e6]: Alice', '- button "Go" [ref=e7]', '- link "x" [ref=e8]']
    out = snap.diff(before, after).splitlines()
    assert out[0] == "[changes since the last snapshot: 2 added, 1 removed]"
    assert set(out[1:]) == {
        '+ - textbox "Name" [ref=e6]: Alice',
        '+ - link "x" [ref=e8]',
        '- - textbox "Name" [ref=e6]',
    }
    assert snap.diff(after, after) == "[no change since the last snapshot]"


async def _through(proxy: EgressProxy, target: str, host_header: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: {host_header}\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data


def test_the_proxy_checks_the_address_it_connects_to() -> None:
    with Site({"/": Reply(body=b"inside")}) as allowed, Site({"/": Reply(body=b"x")}) as victim:
        networks, endpoints = parse_private_allow([allowed.endpoint])
        policy = EgressPolicy(private_networks=networks, private_endpoints=endpoints)
        blocked: list[str] = []

        async def scenario() -> tuple[bytes, bytes, bytes]:
            proxy = EgressProxy(policy, lambda host, why: blocked.append(f"{host} {why}"))
            await proxy.start()
            try:
                ok = await _through(proxy, f"{allowed.url}/", allowed.endpoint)
                refused = await _through(proxy, f"{victim.url}/", victim.endpoint)
                named = await _through(proxy, f"http://localhost:{victim.port}/", "localhost")
                return ok, refused, named
            finally:
                await proxy.stop()

        ok, refused, named = asyncio.run(scenario())
    assert ok.startswith(b"HTTP/1.0 200") or ok.startswith(b"HTTP/1.1 200")
    assert ok.endswith(b"inside")
    assert refused.startswith(b"HTTP/1.1 403") and named.startswith(b"HTTP/1.1 403")
    assert victim.seen == []  # refused before any connection was made
    assert any("loopback" in b for b in blocked) and any("localhost" in b for b in blocked)


class HeldDownloads:
    """A page per user that starts a download on load, and a download route that answers
    only when the test opens its gate: each download completes after the call the test
    chooses, so the last caller is somebody else's session."""

    def __init__(self, users: tuple[str, ...]) -> None:
        self.gates = {user: threading.Event() for user in users}

    def page(self, user: str) -> Reply:
        html = (
            f'<!doctype html><title>{user}</title><a id="d" href="/dl/{user}"'
            f' download="{user}.txt">get</a><script>document.getElementById("d").click()</script>'
        )
        return Reply(body=html.encode(), content_type="text/html")

    def download(self, user: str) -> Callable[[Seen], Reply]:
        def held(seen: Seen) -> Reply:
            self.gates[user].wait(30)
            return Reply(
                body=f"{user}'s file".encode(),
                content_type="application/octet-stream",
                headers={"Content-Disposition": f'attachment; filename="{user}.txt"'},
            )

        return held


class UiProcess:
    """A ui worker process as the browser sees it: one engine, and one PostgreSQL and
    Redis connection that every call of the process shares."""

    def __init__(self, engine: ui_engine.Engine) -> None:
        self.engine = engine
        self.store = Store(engine.settings.database_url)
        self.redis = redis.Redis.from_url(engine.settings.redis_url)

    def browse(self, user: str, session: str, job: str, **args: Any) -> ToolResult:
        """One browser call of `user`'s job in `session`, as the worker runs it."""
        ctx = ToolContext(
            CallContext(workspace="/tmp", user_id=user),
            self.engine.settings,
            job_id=job,
            call_id=uuid.uuid4().hex,
            session_id=session,
            store=lambda: self.store,
            redis=self.redis,
            proc_id="proc:test:1",
        )
        return run_tool(default_registry(), "browser", args, ctx)

    def close(self) -> None:
        self.engine.stop()
        self.redis.close()
        self.store.close()


@pytest.fixture
def ui(
    isolated: Isolated, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[UiProcess, Site, HeldDownloads]]:
    held = HeldDownloads(("alice", "bob"))
    routes: dict[str, Any] = {}
    for user in held.gates:
        routes[f"/{user}.html"] = held.page(user)
        routes[f"/dl/{user}"] = held.download(user)
    with Site(routes) as site:
        settings = isolated.settings.model_copy(
            update={
                "web_private_allow": [site.endpoint],
                "browser_download_dir": str(tmp_path / "quarantine"),
            }
        )
        engine = ui_engine.Engine(settings)
        monkeypatch.setattr(ui_engine, "_engine", engine)  # this process's one browser
        process = UiProcess(engine)
        try:
            yield process, site, held
        finally:
            for gate in held.gates.values():
                gate.set()
            process.close()


def wait_for(what: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


def test_a_download_is_the_artifact_of_the_session_whose_page_made_it(
    ui: tuple[UiProcess, Site, HeldDownloads],
) -> None:
    """Alice's download finishes after Bob's call, Bob's after Alice's next one: each is
    stored for the user, session and job of the page that started it."""
    process, site, held = ui
    sessions = process.engine.sessions

    def stored(name: str) -> dict[str, Any] | None:
        return process.store.conn.execute(
            "SELECT user_id, session_id, job_id FROM artifacts WHERE name = %s", (name,)
        ).fetchone()

    def reported(session: str) -> bool:
        return bool(session in sessions and sessions[session].downloads)

    a = process.browse(
        "alice", "s-alice", "job-a1", action="navigate", url=site.url + "/alice.html"
    )
    assert not a.is_error, a.for_llm
    wait_for(lambda: "/dl/alice" in site.paths())  # alice's download is under way
    b = process.browse("bob", "s-bob", "job-b1", action="navigate", url=site.url + "/bob.html")
    assert not b.is_error, b.for_llm
    wait_for(lambda: "/dl/bob" in site.paths())

    held.gates["alice"].set()  # alice's finishes after bob's call
    wait_for(lambda: reported("s-alice"))
    later = process.browse("alice", "s-alice", "job-a2", action="tabs")
    assert "downloads: " in later.for_llm and "artifact art_" in later.for_llm, later.for_llm
    held.gates["bob"].set()  # bob's finishes after alice's call
    wait_for(lambda: reported("s-bob"))

    assert stored("alice.txt") == {"user_id": "alice", "session_id": "s-alice", "job_id": "job-a1"}
    assert stored("bob.txt") == {"user_id": "bob", "session_id": "s-bob", "job_id": "job-b1"}
    mine = process.browse("bob", "s-bob", "job-b2", action="tabs")
    assert "bob.txt" in mine.for_llm and "alice.txt" not in mine.for_llm

    theirs = process.browse("bob", "s-alice", "job-b3", action="tabs")  # alice's session id
    assert theirs.is_error and "belongs to another user" in theirs.for_llm
