"""What the MCP tests share: a free port, a test server started on it, and a harness that
runs a worker's MCP manager on given servers, recording what it would store."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from broker.config.mcp import McpServer, parse_servers
from broker.config.settings import Settings
from workers.tools.mcp.client import McpManager


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_port(proc: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + 20
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert proc.poll() is None and time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.1)


def serve(transport: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.mcp_servers.web_server", transport, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_port(proc, port)
    yield f"http://127.0.0.1:{port}/{'sse' if transport == 'sse' else 'mcp'}"
    proc.terminate()
    proc.wait(10)


class Kept:
    """Artifacts as `ToolContext.keep_artifact` would keep them, in memory."""

    def __init__(self) -> None:
        self.items: list[tuple[bytes, str, str]] = []

    def __call__(self, data: bytes, mime: str, name: str) -> Any:
        self.items.append((data, mime, name))
        n = len(self.items)

        class Stored:
            def describe(self) -> str:
                return f"artifact art_{n} ({mime}, {len(data)} bytes)"

        return Stored()


class Harness:
    """A manager on given servers, recording the catalog it would store."""

    def __init__(self, servers: list[McpServer], **settings: Any) -> None:
        self.servers = servers
        self.listed: dict[str, list[str]] = {}
        self.facts: dict[str, dict[str, Any]] = {}
        self.manager = McpManager(Settings(**settings), lambda: self.servers, self.on_listed)

    def on_listed(self, server: str, rows: list[Any], facts: dict[str, Any]) -> None:
        self.listed[server] = [r[0] for r in rows]
        self.facts[server] = facts

    def listing(self, server: str) -> list[str]:
        """The server's catalog entries, once it was connected and listed."""
        deadline = time.monotonic() + 20
        while server not in self.listed:
            assert time.monotonic() < deadline, f"{server} was never listed"
            time.sleep(0.05)
        return self.listed[server]

    def call(self, server: str, tool: str, **args: Any) -> Any:
        return self.manager.call(server, tool, args)


@pytest.fixture
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    made: list[Harness] = []

    def make(servers: dict[str, Any], **settings: Any) -> Harness:
        made.append(Harness(parse_servers(servers), **settings))
        return made[-1]

    yield make  # type: ignore[misc]
    for h in made:
        h.manager.close()


def endpoint(url: str) -> str:
    """The server's `host:port`, exempted from the egress guard's private block."""
    return url.split("/")[2]
