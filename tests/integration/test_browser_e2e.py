"""The browser through the whole stack with real Chromium (Debian's, driven by Playwright):
navigate, snapshot with refs, fill a form and submit it by ref (the server receives it),
a JPEG screenshot as an artifact served by the HTTP API, a diff snapshot smaller than the
first, the session kept across jobs of one session, the egress policy inside the page,
and a killed ui worker reported as a lost session."""

from __future__ import annotations

import io
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.protocol import AGENT_RUN_TASK, AGENTS_QUEUE, JobResult, JobSpec
from tests.integration.conftest import (
    Cluster,
    call,
    script,
    serve_api,
    start_cluster,
    wait_until,
)
from tests.sites import Reply, Site, redirect

FORM = (
    b"""<!doctype html><html><head><title>Signup</title></head><body>
<h1>Signup</h1>
<form method="post" action="/submit">
  <label>Name <input name="name"></label>
  <label><input type="checkbox" name="agree" value="yes"> I agree</label>
  <button type="submit">Submit</button>
</form>
<div id="items"></div>
<button onclick="for (let i = 0; i < 3; i++) { const b = document.createElement('button');
  b.textContent = 'added ' + i; document.getElementById('items').appendChild(b); }">More</button>
<nav>"""
    + b"".join(b'<a href="/p%d">page %d</a> ' % (i, i) for i in range(40))
    + b"""</nav>
</body></html>"""
)


@pytest.fixture(scope="module")
def victim() -> Iterator[Site]:
    with Site({"/secret.png": Reply(body=b"never", content_type="image/png")}) as site:
        yield site


class Listener:
    """A TCP port on a blocked address that counts who connects (a TLS ClientHello is a
    connection too): what the page may not reach over HTTPS or wss."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.server.close()


@pytest.fixture(scope="module")
def tls_victim() -> Iterator[Listener]:
    listener = Listener()
    yield listener
    listener.close()


@pytest.fixture(scope="module")
def site(victim: Site, tls_victim: Listener) -> Iterator[Site]:
    secure = f"https://127.0.0.1:{tls_victim.port}"
    leak = (
        "<html><body><p>leaky</p>"
        f'<img src="{victim.url}/secret.png">'  # a blocked private address, plain HTTP
        f'<img src="{secure}/secret.png">'  # the same over HTTPS: a CONNECT
        '<img src="/bounce">'  # an allowed URL that redirects to the blocked one
        f'<iframe src="{secure}/frame"></iframe>'
        "<script>const ws = new Promise(done => { try { const s = new WebSocket("
        f"'wss://127.0.0.1:{tls_victim.port}/ws'); s.onerror = s.onclose = done; }}"
        " catch (e) { done(); } });"
        f"Promise.allSettled([fetch('{victim.url}/fetched'), fetch('/bounce?js'), ws])"
        ".then(() => { const p = document.createElement('p');"
        " p.textContent = 'settled'; document.body.appendChild(p); });"
        "</script></body></html>"
    )
    with Site(
        {
            "/": Reply(body=FORM, content_type="text/html"),
            "/submit": Reply(
                body=b"<html><title>Thanks</title><p>thanks</p></html>", content_type="text/html"
            ),
            "/leak": Reply(body=leak.encode(), content_type="text/html"),
            "/bounce": redirect(f"{victim.url}/redirected.png"),
        }
    ) as s:
        yield s


@pytest.fixture(scope="module")
def cluster(site: Site) -> Iterator[Cluster]:
    # two ui workers: the last two tests kill one each (the other answers for the first)
    yield from start_cluster(groups=("ui",), workers_per_group=2, web_private_allow=[site.endpoint])


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Iterator[str]:
    yield from serve_api(cluster)


@pytest.fixture(scope="module")
def api_keys(cluster: Cluster) -> dict[str, str]:
    from broker.stores.api_keys import ApiKeyStore

    store = ApiKeyStore(cluster.client.store)
    return {user: store.create(user)[1] for user in ("alice", "bob")}


def in_session(
    cluster: Cluster, session: str, workspace: Path, *turns: dict[str, Any]
) -> JobResult:
    """A job of `session` (a later job of the same session when it exists)."""
    job_id = uuid.uuid4().hex
    spec = JobSpec(
        prompt="browse",
        workspace=str(workspace),
        allow=["browser"],
        script=script(*turns, {"text": "done"}),
        user_id="alice",
    )
    cluster.client.store.create_job(job_id, session_id=session, spec=spec, user_id="alice")
    cluster.client.app.send_task(
        AGENT_RUN_TASK, kwargs={"job_id": job_id}, queue=AGENTS_QUEUE, task_id=job_id
    )
    from orchestrator.client import Job

    result = Job(cluster.client, job_id).wait(timeout=90)
    assert result.status == "completed", result
    return result


def browser(call_id: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [call(call_id, "browser", **args)]}


def canvas(call_id: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [call(call_id, "canvas", **args)]}


def ref_of(snapshot: str, pattern: str) -> str:
    found = re.search(pattern + r".*?\[ref=([a-z0-9]+)\]", snapshot)
    assert found, snapshot
    return found.group(1)


def test_a_form_is_filled_and_submitted_by_ref_across_jobs_of_one_session(
    cluster: Cluster, site: Site, api: str, api_keys: dict[str, str], workspace: Path
) -> None:
    session = "s-" + uuid.uuid4().hex[:8]
    first = in_session(
        cluster,
        session,
        workspace,
        browser("n", action="navigate", url=site.url + "/"),
        browser("s", action="snapshot"),
    )
    navigated, snapped = first.tool_calls
    assert not navigated.is_error and "Signup" in navigated.output, navigated.output
    assert navigated.queue == "ui"
    name, submit = (
        ref_of(snapped.output, 'textbox "Name"'),
        ref_of(snapped.output, 'button "Submit"'),
    )
    agree = ref_of(snapped.output, 'checkbox "I agree"')
    more = ref_of(snapped.output, 'button "More"')

    second = in_session(  # a later job of the same session: the same tab, the same refs
        cluster,
        session,
        workspace,
        browser("f", action="fill", ref=name, text="Alice"),
        browser("c", action="click", ref=agree),
        browser("m", action="click", ref=more),
        browser("d", action="snapshot", diff=True),
        browser("k", action="click", ref=submit),
        browser("w", action="wait_for", text="thanks"),
        browser("p", action="screenshot"),
    )
    outputs = {c.id: c for c in second.tool_calls}
    assert not any(c.is_error for c in second.tool_calls), [c.output for c in second.tool_calls]
    # pinned: every later call ran in the process that holds the session (of two ui workers)
    assert {c.worker for c in second.tool_calls} == {navigated.worker}
    assert len(outputs["d"].output) < len(snapped.output)
    # the three new buttons, and the two fields whose state changed: nothing else
    assert "changes since the last snapshot: 5 added, 2 removed" in outputs["d"].output
    assert 'textbox "Name" [ref=' in outputs["d"].output and ": Alice" in outputs["d"].output
    assert 'button "added 2"' in outputs["d"].output
    posted = [s for s in site.seen if s.path == "/submit"]
    assert posted and posted[-1].form() == {"name": ["Alice"], "agree": ["yes"]}

    artifact_id = re.search(r"artifact (art_[0-9a-f]+)", outputs["p"].output)
    assert artifact_id, outputs["p"].output
    import httpx
    from PIL import Image

    alice, bob = api_keys["alice"], api_keys["bob"]
    url = f"{api}/v1/artifacts/{artifact_id.group(1)}"
    fetched = httpx.get(url, headers={"Authorization": f"Bearer {alice}"})
    assert fetched.status_code == 200 and fetched.headers["content-type"] == "image/jpeg"
    image = Image.open(io.BytesIO(fetched.content))
    assert image.format == "JPEG" and (image.width, image.height) == (1280, 800)
    other = httpx.get(url, headers={"Authorization": f"Bearer {bob}"})
    assert other.status_code == 404  # another user's artifact does not exist for them


def test_the_egress_policy_holds_inside_the_page(
    cluster: Cluster, site: Site, victim: Site, tls_victim: Listener, workspace: Path
) -> None:
    session = "s-" + uuid.uuid4().hex[:8]
    result = in_session(
        cluster,
        session,
        workspace,
        browser("n", action="navigate", url=site.url + "/leak"),
        browser("w", action="wait_for", text="settled"),  # the page's requests are done
        browser("s", action="snapshot", full=True),
    )
    navigated, _, snapped = result.tool_calls
    assert not navigated.is_error and "leaky" in snapped.output
    # the page did ask: the allowed site saw both requests that redirect to the victim
    assert site.paths().count("/bounce") == 2, site.paths()
    # and nothing reached a blocked address: not plain HTTP (an image, fetch(), a
    # redirect of an allowed URL, in the page or in a script), not HTTPS, wss or a frame
    assert victim.seen == [], victim.paths()
    assert tls_victim.connections == 0
    refused = in_session(
        cluster, session, workspace, browser("f", action="navigate", url="file:///etc/passwd")
    )
    (call_,) = refused.tool_calls
    assert call_.is_error and "root:" not in call_.output


def test_the_live_canvas_page_shows_what_the_agent_pushes(
    cluster: Cluster, api: str, api_keys: dict[str, str], workspace: Path
) -> None:
    from playwright.sync_api import sync_playwright

    session = "s-" + uuid.uuid4().hex[:8]
    first = in_session(
        cluster,
        session,
        workspace,
        canvas("c", action="present", content="# First"),
    )
    assert "version 1" in first.tool_calls[0].output
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            context = chromium.new_context(
                extra_http_headers={"Authorization": f"Bearer {api_keys['alice']}"}
            )
            page = context.new_page()
            page.goto(f"{api}/v1/sessions/{session}/canvas")
            heading = page.frame_locator("#canvas").locator("h1")
            heading.wait_for(timeout=10_000)
            assert heading.inner_text() == "First"
            in_session(  # two pushes by a later job: the page ends on the second
                cluster,
                session,
                workspace,
                {
                    "tool_calls": [
                        call(
                            "u",
                            "canvas",
                            action="update",
                            content="<h1>Between</h1>",
                            format="html",
                        )
                    ]
                },
                {
                    "tool_calls": [
                        call(
                            "v",
                            "canvas",
                            action="update",
                            content="<h1>Second</h1><p>two</p>",
                            format="html",
                        )
                    ]
                },
            )
            page.wait_for_function(
                "document.getElementById('version').textContent === '3'", timeout=10_000
            )
            assert heading.inner_text() == "Second"
            forbidden = chromium.new_context(
                extra_http_headers={"Authorization": f"Bearer {api_keys['bob']}"}
            ).new_page()
            assert forbidden.goto(f"{api}/v1/sessions/{session}/canvas").status == 404
        finally:
            chromium.close()
    snap = in_session(cluster, session, workspace, canvas("s", action="snapshot"))
    (shot,) = snap.tool_calls
    found = re.search(r"artifact (art_[0-9a-f]+) \(image/jpeg", shot.output)
    assert found, shot.output


def test_a_signed_link_opens_the_canvas_in_a_browser_that_has_no_key(
    cluster: Cluster, api: str, api_keys: dict[str, str], workspace: Path
) -> None:
    """Issue 30: every job answer names its session; the session's canvas opens in a plain
    browser by a short-lived signed link (from the API or `clawq canvas open`)."""
    import httpx

    alice = httpx.Client(base_url=api, headers={"Authorization": f"Bearer {api_keys['alice']}"})
    bob = httpx.Client(base_url=api, headers={"Authorization": f"Bearer {api_keys['bob']}"})
    with alice, bob:
        signed_link_checks(cluster, api, alice, bob, workspace)


def signed_link_checks(cluster: Cluster, api: str, alice: Any, bob: Any, workspace: Path) -> None:
    """The link's whole walk, by alice's and bob's clients (closed by the caller)."""
    from click.testing import CliRunner
    from playwright.sync_api import sync_playwright

    from broker.stores.canvas import link_key, sign_link
    from orchestrator.cli import main as cli

    body = {
        "prompt": "show",
        "workspace": str(workspace),
        "script": script(canvas("c", action="present", content="# Linked"), {"text": "done"}),
    }
    submitted = alice.post("/v1/jobs", json=body).json()
    session = submitted["session_id"]
    deadline = time.monotonic() + 60
    while (answer := alice.get(f"/v1/jobs/{submitted['job_id']}").json())["status"] in (
        "queued",
        "running",
    ):
        assert time.monotonic() < deadline, answer
        time.sleep(0.2)
    assert answer["status"] == "completed" and answer["session_id"] == session

    link = alice.get(f"/v1/sessions/{session}/canvas-link").json()
    assert link["url"].startswith(f"{api}/v1/sessions/{session}/canvas?token=")
    assert 0 < link["expires_at"] - time.time() <= 600
    assert bob.get(f"/v1/sessions/{session}/canvas-link").status_code == 404
    port = api.rsplit(":", 1)[1]
    opened = CliRunner().invoke(
        cli.main,
        ["canvas", "open", session, "--print"],
        env={**cluster.env, "CLAWQ_API_PORT": port, "CLAWQ_HOME": str(workspace)},
    )
    assert opened.exit_code == 0, opened.output
    by_cli = opened.stdout.strip()
    key = link_key(cluster.client.redis)
    expired, _ = sign_link(key, session, -1, time.time())
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            for url in (link["url"], by_cli):
                page = chromium.new_context().new_page()  # no Authorization header
                assert page.goto(url).status == 200
                heading = page.frame_locator("#canvas").locator("h1")
                heading.wait_for(timeout=10_000)  # the events came, by the same token
                assert heading.inner_text() == "Linked"
            plain = chromium.new_context().new_page()
            tampered = link["url"][:-2] + ("AA" if not link["url"].endswith("AA") else "BB")
            for refused in (tampered, link["url"].split("?")[0], f"{api}/v1/sessions/"
                            f"{session}/canvas?token={expired}"):  # fmt: skip
                assert plain.goto(refused).status == 401
            other = sign_link(key, "s-other", 600, time.time())[0]  # a token of another session
            assert plain.goto(f"{api}/v1/sessions/{session}/canvas?token={other}").status == 401
        finally:
            chromium.close()


def test_a_killed_ui_worker_makes_the_next_call_report_the_lost_session(
    cluster: Cluster, site: Site, workspace: Path
) -> None:
    session = "s-" + uuid.uuid4().hex[:8]
    in_session(cluster, session, workspace, browser("n", action="navigate", url=site.url + "/"))
    import json
    import os

    import redis

    from broker import keys

    with redis.Redis.from_url(cluster.iso.redis_url) as r:
        pin = json.loads(r.get(keys.pin(session, "browser")) or b"{}")
        pid = int(pin["proc"].rsplit(":", 1)[1])  # the ui worker process holding the session
        os.kill(pid, signal.SIGKILL)
        wait_until(  # its heartbeat runs out: the orchestrator's test of a live pin
            lambda: not r.exists(keys.proc(pin["proc"])),
            cluster.iso.settings.heartbeat_ttl_s + 30,
            "the killed worker's heartbeat gone",
        )
    started = time.monotonic()
    result = in_session(cluster, session, workspace, browser("s", action="snapshot"))
    (lost,) = result.tool_calls
    assert lost.is_error and "browser session was lost" in lost.output, lost.output
    assert time.monotonic() - started < 15  # answered by the other ui worker, not a timeout


def test_a_call_sent_just_after_its_ui_worker_died_is_answered_session_lost_at_once(
    cluster: Cluster, site: Site, workspace: Path
) -> None:
    """The dead process's heartbeat key lives on for its TTL, so the call is routed to
    that process's own queue, which nobody reads: its last beat grows old, and the call
    is answered "session lost" within seconds (it waited 300 s for a worker before)."""
    session = "s-" + uuid.uuid4().hex[:8]
    in_session(cluster, session, workspace, browser("n", action="navigate", url=site.url + "/"))
    import json
    import os

    import redis

    from broker import keys

    with redis.Redis.from_url(cluster.iso.redis_url) as r:
        pin = json.loads(r.get(keys.pin(session, "browser")) or b"{}")
        pid = int(pin["proc"].rsplit(":", 1)[1])
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.3)
        assert r.exists(keys.proc(pin["proc"]))  # its key still says it lives
    started = time.monotonic()
    result = in_session(cluster, session, workspace, browser("s", action="snapshot"))
    (lost,) = result.tool_calls
    assert lost.is_error and "lost" in lost.output, lost.output
    assert time.monotonic() - started < 10
    with redis.Redis.from_url(cluster.iso.redis_url) as r:
        assert not r.exists(keys.pin(session, "browser"))  # the next call starts a new one
