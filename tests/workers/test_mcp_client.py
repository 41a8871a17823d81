"""The MCP sessions of a worker process against real servers: `mcp-server-time` and
`mcp-server-git` from PyPI over stdio, a paginating stdio server, and a streamable-HTTP
server built on the MCP SDK (tests/mcp_servers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.config.mcp import McpServer, parse_servers
from broker.config.settings import Settings
from tests.conftest import Isolated
from tests.workers.mcp_harness import Kept, endpoint, free_port, serve
from workers.tools.mcp.client import McpError, McpManager
from workers.tools.mcp.results import to_result

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def web_url() -> Iterator[str]:
    yield from serve("streamable-http")


@pytest.fixture(scope="module")
def sse_url() -> Iterator[str]:
    yield from serve("sse")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    (tmp_path / "repo" / "notes.txt").write_text("hello\n")
    return tmp_path / "repo"


def server_pids() -> list[int]:
    """The mcp-server-time processes this test process started (over stdio)."""
    found = subprocess.run(
        ["pgrep", "-P", str(os.getpid()), "-f", "mcp-server-time"], capture_output=True, text=True
    )
    return [int(p) for p in found.stdout.split()]


def test_third_party_servers_over_stdio(harness: Any, repo: Path) -> None:
    h = harness(
        {
            "time": {"command": str(BIN / "mcp-server-time")},
            "git": {"command": str(BIN / "mcp-server-git"), "args": ["--repository", str(repo)]},
            "paged": {"command": sys.executable, "args": ["-m", "tests.mcp_servers.paged_server"]},
        }
    )
    now = h.call("time", "get_current_time", timezone="UTC")
    assert now["structuredContent"]["timezone"] == "UTC" and not now["isError"]
    status = to_result("git", h.call("git", "git_status", repo_path=str(repo)), 10_000)
    assert "notes.txt" in status.for_llm and not status.is_error
    assert status.for_llm.startswith("[untrusted content from MCP server 'git'")
    assert h.call("paged", "t4")["content"][0]["text"] == "called t4"
    assert h.listed["time"] == ["get_current_time", "convert_time"]
    assert "git_commit" in h.listed["git"] and len(h.listed["git"]) >= 10
    assert h.listed["paged"] == ["t0", "t1", "t2", "t3", "t4"]  # three pages, all listed
    (held,) = server_pids()  # one server process per stdio server held by this process
    for _ in range(20):
        h.call("time", "get_current_time", timezone="UTC")
    assert server_pids() == [held]  # every call on one held session, not one per call


def test_a_killed_server_is_reconnected(harness: Any) -> None:
    h = harness(
        {"time": {"command": str(BIN / "mcp-server-time")}},
        mcp_reconnect_initial_s=0.1,
        mcp_reconnect_max_s=0.5,
    )
    h.call("time", "get_current_time", timezone="UTC")
    (pid,) = server_pids()
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    with pytest.raises(McpError, match="closed during get_current_time; it is being reconnected"):
        h.call("time", "get_current_time", timezone="UTC")  # finds it dead: reconnects
    again = h.call("time", "get_current_time", timezone="UTC")  # the next call works
    assert not again["isError"] and h.manager.state() == {"time": "connected"}


def test_the_health_check_reconnects_a_dead_server_without_a_call(harness: Any) -> None:
    h = harness(
        {"time": {"command": str(BIN / "mcp-server-time")}},
        mcp_health_interval_s=0.3,
        mcp_reconnect_initial_s=0.1,
    )
    h.call("time", "get_current_time", timezone="UTC")

    (first,) = server_pids()
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while server_pids() in ([], [first]) or h.manager.state() != {"time": "connected"}:
        assert time.monotonic() < deadline, "the health check did not reconnect"
        time.sleep(0.1)
    assert not h.call("time", "get_current_time", timezone="UTC")["isError"]


def test_sse_transport(harness: Any, sse_url: str) -> None:
    h = harness(
        {"legacy": {"type": "sse", "url": sse_url, "headers": {"X-Test": "1"}}},
        web_private_allow=[endpoint(sse_url)],
    )
    assert h.call("legacy", "add", a=20, b=22)["structuredContent"] == {"result": 42}
    assert "picture" in h.listed["legacy"]


def test_an_unreachable_server_fails_cleanly_after_backoff(harness: Any) -> None:
    port = free_port()
    h = harness(
        {"down": {"url": f"http://127.0.0.1:{port}/mcp", "total_timeout_s": 5}},
        web_private_allow=[f"127.0.0.1:{port}"],
        mcp_reconnect_initial_s=0.05,
        mcp_reconnect_max_s=0.2,
        mcp_reconnect_attempts=4,
        mcp_health_interval_s=60,
    )
    started = time.monotonic()
    with pytest.raises(McpError) as first:
        h.call("down", "anything")
    assert time.monotonic() - started < 5
    deadline = time.monotonic() + 5
    while h.manager.state().get("down") != "failed":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with pytest.raises(McpError) as later:
        h.call("down", "anything")
    assert "MCP server 'down'" in str(first.value)
    assert str(later.value).startswith(
        "MCP server 'down' is unavailable: 4 reconnection attempts failed (last: ConnectError"
    )


def test_streamable_http_results_and_timeouts(harness: Any, web_url: str) -> None:
    h = harness(
        {
            "web": {"url": web_url, "headers": {"Authorization": "Bearer t"}},
            "quick": {"url": web_url, "idle_timeout_s": 0.5},
        },
        web_private_allow=[endpoint(web_url)],
    )
    assert h.call("web", "add", a=2, b=3)["structuredContent"] == {"result": 5}
    picture = to_result("web", h.call("web", "picture"), 10_000)
    assert (
        picture.for_llm.endswith("[image: image/png, 69 bytes, not shown]")
        or "[image: image/png" in picture.for_llm
    )
    failed = to_result("web", h.call("web", "fail", message="boom"), 10_000)
    assert failed.is_error and "fail" in failed.for_llm
    with pytest.raises(McpError, match=r"nap on MCP server 'quick' timed out: no result and no "):
        h.call("quick", "nap", seconds=3)
    assert h.call("web", "add", a=1, b=1)["structuredContent"] == {"result": 2}  # still usable
    assert h.listed["web"][:4] == ["add", "nap", "fail", "picture"]


def test_http_servers_meet_the_egress_guard(harness: Any, web_url: str, sse_url: str) -> None:
    """A server on a blocked address, not exempted, is never connected to: its address is
    checked like any request's (the same servers answer when exempted, above)."""
    h = harness(
        {
            "web": {"url": web_url},
            "legacy": {"type": "sse", "url": sse_url},
            "meta": {"url": "http://metadata.google.internal/mcp"},
        },
        mcp_reconnect_attempts=1,
        mcp_health_interval_s=60,
    )
    for server, why in (
        ("web", "127.0.0.1, a loopback address"),
        ("legacy", "127.0.0.1, a loopback address"),
        ("meta", "metadata.google.internal is an internal host name"),
    ):
        with pytest.raises(McpError, match=why):
            h.call(server, "add", a=1, b=1)


def test_results_become_text_with_placeholders_and_a_cap() -> None:
    raw = {
        "content": [
            {"type": "text", "text": "a" * 50},
            {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"},
            {"type": "resource", "resource": {"uri": "file:///x.bin", "blob": "AAAA"}},
            {"type": "resource_link", "uri": "file:///y", "name": "y"},
        ],
        "isError": False,
    }
    full = to_result("s", raw, 1000).for_user
    assert full.splitlines()[1:] == [
        "[audio: audio/wav, 3 bytes, not shown]",
        "[resource file:///x.bin: application/octet-stream, 3 bytes, not shown]",
        "[link y <file:///y>; read_resource reads it]",
    ]
    cut = to_result("s", raw, 60).for_user
    assert cut == full[:60] + f"\n[output cut at 60 characters of {len(full)}]"
    structured = to_result("s", {"content": [], "structuredContent": {"k": 1}}, 1000)
    assert '"k": 1' in structured.for_llm
    assert to_result("s", {"content": []}, 1000).for_user == "(no output)"


def test_a_call_is_checked_against_the_grants_again_on_the_worker(isolated: Isolated) -> None:
    from broker.pg.store import Store
    from broker.protocol import CallContext
    from broker.stores.mcp import McpStore, McpToolRow
    from workers.tool import ToolContext, ToolError
    from workers.tools.mcp.tool import McpInput, tool_class

    store = Store(isolated.database_url)
    try:
        McpStore(store).add_server(parse_servers({"time": {"command": "x"}})[0])
        row = McpToolRow(
            server="time",
            tool="now",
            exposed_name="mcp_time__now",
            description="",
            input_schema={"type": "object"},
        )
        tool = tool_class(row, 5)()
        ctx = ToolContext(
            context=CallContext(workspace="/tmp", agent_id="main"),
            settings=isolated.settings,
            store=lambda: store,
        )
        with pytest.raises(ToolError, match="mcp_time__now is not granted to this agent or user"):
            tool.run(McpInput(), ctx)  # revoked after the job started: the worker refuses
    finally:
        store.close()


def test_on_a_fresh_database_the_manager_waits_for_the_schema_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    import psycopg

    from broker.pg.store import Store
    from broker.stores.mcp import McpStore
    from tests.conftest import PG_BASE
    from workers.tools.mcp.client import CatalogStore

    schema = "t_fresh_" + os.urandom(4).hex()
    url = f"{PG_BASE}?options=-csearch_path%3D{schema}"
    with psycopg.connect(PG_BASE, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # no migrations yet
    manager = None
    catalog = CatalogStore(Settings(database_url=url))
    try:
        with caplog.at_level(logging.INFO, "clawq.mcp"):
            manager = McpManager(Settings(database_url=url), catalog.load, catalog.on_listed)
            deadline = time.monotonic() + 10  # its first health check met the bare schema
            while "waiting for the migrations" not in caplog.text:
                assert time.monotonic() < deadline, caplog.text
                time.sleep(0.02)
            manager.nudge()  # again, before the migrations: still said only once
            store = Store(url)
            store.migrate()
            McpStore(store).add_server(
                McpServer(name="time", transport="stdio", command=str(BIN / "mcp-server-time"))
            )
            manager.nudge()  # as a change notice does
            deadline = time.monotonic() + 20
            while manager.state() != {"time": "connected"}:
                assert time.monotonic() < deadline, manager.state()
                time.sleep(0.05)
            store.close()
        waiting = [r for r in caplog.records if "waiting for the migrations" in r.getMessage()]
        assert len(waiting) == 1 and not any(r.exc_info for r in caplog.records)
    finally:
        if manager is not None:
            manager.close()
        catalog.close()
        with psycopg.connect(PG_BASE, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def test_structured_output_is_checked_against_the_output_schema(harness: Any, web_url: str) -> None:
    h = harness({"web": {"url": web_url}}, web_private_allow=[endpoint(web_url)])
    good = to_result("web", h.call("web", "weather"), 10_000)
    assert good.for_user == '{"temperature": 21.5, "conditions": "sunny"}'
    with pytest.raises(McpError, match="answered liar with a result that does not match the tool"):
        h.call("web", "liar")  # lists temperature as a string, returns a number
    assert h.manager.state() == {"web": "connected"}  # a bad result is not a dead session
    assert not h.call("web", "add", a=1, b=2)["isError"]


def test_audio_and_images_become_artifacts(harness: Any, web_url: str) -> None:
    h = harness({"web": {"url": web_url}}, web_private_allow=[endpoint(web_url)])
    kept = Kept()
    sound = to_result("web", h.call("web", "sound"), 10_000, kept)
    picture = to_result("web", h.call("web", "picture"), 10_000, kept)
    (wav, audio_mime, _), (png, image_mime, _) = kept.items
    assert wav.startswith(b"RIFF") and audio_mime == "audio/wav"
    assert png.startswith(b"\x89PNG") and image_mime == "image/png"
    assert sound.for_user == f"[audio: artifact art_1 (audio/wav, {len(wav)} bytes)]"
    assert f"[image: artifact art_2 (image/png, {len(png)} bytes)]" in picture.for_llm


@pytest.mark.parametrize("transport", ["streamable-http", "stdio"])
def test_a_cancelled_call_tells_the_server(
    harness: Any, web_url: str, tmp_path: Path, transport: str
) -> None:
    """Over stdio the SDK sends notifications/cancelled; over streamable HTTP at 2026-07-28
    it aborts the request's POST, which the server takes as the cancel."""
    stdio = {"command": sys.executable, "args": ["-m", "tests.mcp_servers.web_server", "stdio"]}
    entry = stdio if transport == "stdio" else {"url": web_url}
    h = harness({"web": entry}, web_private_allow=[endpoint(web_url)])
    marker = tmp_path / "cancelled"
    started = tmp_path / "cancelled.started"
    with pytest.raises(McpError, match="hold on MCP server 'web' was cancelled: the job was"):
        h.manager.call(
            "web",
            "hold",
            {"marker": str(marker)},
            cancelled=lambda: "the job was cancelled" if started.exists() else None,
        )
    deadline = time.monotonic() + 10
    while not marker.exists():  # notifications/cancelled reached the tool
        assert time.monotonic() < deadline, "the server was never told"
        time.sleep(0.05)
    assert not h.call("web", "add", a=1, b=2)["isError"]


def test_progress_notifications_reach_the_caller_in_order(harness: Any, web_url: str) -> None:
    h = harness(
        {"web": {"url": web_url, "idle_timeout_s": 1}}, web_private_allow=[endpoint(web_url)]
    )
    heard: list[tuple[float, float | None, str | None]] = []
    done = h.manager.call("web", "steps", {"count": 6, "interval": 0.4}, progress=heard.extend)
    assert done["content"][0]["text"] == "6 steps"
    assert heard == [(n, 6, f"step {n}") for n in range(1, 7)]
