"""(p) the browser, against bare Playwright driving the same Chromium in the same run:
- snapshot characters for three local pages: clawq's snapshot (actionable elements with
  refs), its diff after a change, against Playwright's own `aria_snapshot()` and its
  `mode="ai"` tree;
- actions per second: `click` by ref through clawq (dispatcher → ui queue → the pinned
  worker process → Playwright) against bare `locator.click()`;
- memory per browser session: the Chromium process tree's RSS and PSS, before and after
  five more sessions."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from broker import keys
from broker.protocol import CallContext, CallEnvelope
from orchestrator.calls.dispatch import running_dispatcher

CLICKS = int(os.environ.get("BENCH_UI_CLICKS", "50"))
SESSIONS = int(os.environ.get("BENCH_UI_SESSIONS", "5"))
COUNTER = (
    '<button id="c" onclick="this.textContent = \'clicked \' + (++window.n || (window.n = 1))">'
    "count</button>"
)
PAGES = {
    "/form": "<title>Form</title><h1>Signup</h1><form><label>Name <input name=n></label>"
    "<label><input type=checkbox> agree</label><select><option>red<option>blue</select>"
    "<button>Submit</button></form>" + COUNTER,
    "/article": "<title>Article</title><h1>A long read</h1>"
    + "".join(f"<h2>Part {i}</h2><p>{'Words of the article. ' * 40}</p>" for i in range(30))
    + "".join(f'<a href="/a{i}">related {i}</a> ' for i in range(30)),
    "/catalog": "<title>Catalog</title><table>"
    + "".join(
        f"<tr><td>Item {i}</td><td>{i * 3} EUR</td><td><button>Add {i}</button></td></tr>"
        for i in range(100)
    )
    + "</table>",
}


class Pages(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = (
            "<!doctype html><html><body>" + PAGES.get(self.path, "") + "</body></html>"
        ).encode()
        self.send_response(200 if self.path in PAGES else 404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def tree_memory() -> tuple[float, float]:
    """RSS and PSS (MB) of every chromium process on this machine."""
    rss = pss = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if "chromium" not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                continue
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            continue
    return rss / 1024, pss / 1024


def bare(base: str) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    out: dict[str, Any] = {"chars": {}}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page()
        for path in PAGES:
            page.goto(base + path)
            out["chars"][path] = (len(page.aria_snapshot()), len(page.aria_snapshot(mode="ai")))
        page.goto(base + "/form")
        button = page.locator("#c")
        button.click()
        started = time.perf_counter()
        for _ in range(CLICKS):
            button.click()
        out["clicks_per_s"] = CLICKS / (time.perf_counter() - started)
        browser.close()
    return out


async def through_clawq(bench: Any, base: str) -> dict[str, Any]:
    import json

    import redis

    out: dict[str, Any] = {"chars": {}}
    async with running_dispatcher(bench.settings, f"bench-ui-{uuid.uuid4().hex[:6]}") as d:
        client = redis.Redis.from_url(bench.settings.redis_url)

        async def call(session: str, n: int, **args: Any) -> str:
            raw = client.get(keys.pin(session, "browser"))
            queue = json.loads(raw)["queue"] if raw else "ui"
            envelope = CallEnvelope(
                call_id=f"b{n}",
                job_id=session,
                session_id=session,
                tool="browser",
                input=args,
                context=CallContext(workspace="/tmp"),
                timeout_s=30,
                deadline=time.time() + 120,
                reply_to=d.reply_key,
            )
            outcome = await d.call(envelope, queue)
            if outcome.is_error:
                raise RuntimeError(f"browser {args}: {outcome.for_llm[:300]}")
            return outcome.for_llm

        session = "bench-" + uuid.uuid4().hex[:8]
        n = 0
        for path in PAGES:
            await call(session, n := n + 1, action="navigate", url=base + path)
            first = await call(session, n := n + 1, action="snapshot")
            again = await call(session, n := n + 1, action="snapshot", diff=True)
            out["chars"][path] = (len(first), len(again))
        await call(session, n := n + 1, action="navigate", url=base + "/form")
        snapshot = await call(session, n := n + 1, action="snapshot")
        ref = re.search(r'button "count" \[ref=([a-z0-9]+)\]', snapshot)
        assert ref, snapshot
        await call(session, n := n + 1, action="click", ref=ref.group(1))
        started = time.perf_counter()
        for _ in range(CLICKS):
            await call(session, n := n + 1, action="click", ref=ref.group(1))
        out["clicks_per_s"] = CLICKS / (time.perf_counter() - started)
        before = tree_memory()
        for i in range(SESSIONS):
            await call(f"{session}-{i}", 1, action="navigate", url=base + "/article")
        await asyncio.sleep(2)
        after = tree_memory()
        out["per_session"] = ((after[0] - before[0]) / SESSIONS, (after[1] - before[1]) / SESSIONS)
        for i in range(SESSIONS):
            await call(f"{session}-{i}", 2, action="close")
        await call(session, n + 1, action="close")
        client.close()
    return out


def run(console: Console, bench: Any, process: Any, wait_for: Any) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Pages)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    env = {**bench.env, "CLAWQ_WEB_PRIVATE_ALLOW": f'["127.0.0.1:{server.server_address[1]}"]'}
    worker = [sys.executable, "-m", "orchestrator.cli", "worker", "--group", "ui"]
    try:
        plain = bare(base)
        with process([*worker, "--log-level", "warning"], env):
            wait_for(bench.workers_ready("ui", 1))
            ours = asyncio.run(through_clawq(bench, base))
    finally:
        server.shutdown()
        server.server_close()
    table = Table(title="(p) snapshot characters, three local pages")
    for col in ("page", "clawq snapshot", "clawq diff, unchanged", "aria_snapshot()", "ai mode"):
        table.add_column(col, justify="right")
    for path in PAGES:
        table.add_row(path, *(str(x) for x in (*ours["chars"][path], *plain["chars"][path])))
    console.print(table)
    table = Table(title=f"(p) {CLICKS} clicks one after another")
    for col in ("path", "clicks/s", "vs bare Playwright"):
        table.add_column(col, justify="right")
    ratio = ours["clicks_per_s"] / plain["clicks_per_s"]
    table.add_row("clawq browser click by ref", f"{ours['clicks_per_s']:.1f}", f"{ratio:.2f}x")
    table.add_row("bare Playwright locator.click()", f"{plain['clicks_per_s']:.1f}", "1.00x")
    console.print(table)
    rss, pss = ours["per_session"]
    console.print(f"(p) memory per browser session: RSS +{rss:.0f} MB, PSS +{pss:.0f} MB")
