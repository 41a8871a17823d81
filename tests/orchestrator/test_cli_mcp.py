"""`clawq mcp …` on a real PostgreSQL: servers, grants and the access-request flow."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from broker.pg.store import Store
from broker.stores.mcp import McpStore
from orchestrator.cli import main as cli
from tests.conftest import Isolated


def test_servers_grants_and_requests_from_the_cli(isolated: Isolated, tmp_path: Path) -> None:
    runner = CliRunner()

    def clawq(*args: str) -> str:
        done = runner.invoke(cli.main, ["mcp", *args], env=isolated.env())
        assert done.exit_code == 0, done.output
        return done.output

    config = tmp_path / "mcp.json"
    secret = {"Authorization": "Bearer very-secret"}
    servers = {"mcpServers": {"web": {"url": "https://example.com/mcp", "headers": secret}}}
    config.write_text(json.dumps(servers))
    assert clawq("add", str(config)) == "added web\n"
    assert clawq("add", '{"time": {"command": "mcp-server-time"}}') == "added time\n"
    listed = clawq("list")
    assert "streamable-http" in listed and "mcp-server-time" in listed
    assert "very-secret" not in listed
    store = Store(isolated.database_url)
    McpStore(store).set_facts("time", {"protocol_version": "2025-11-25"})  # as a worker does
    store.close()
    (time_row,) = [r for r in clawq("list").splitlines() if r.startswith("time ")]
    assert time_row.split()[-1] == "2025-11-25"  # the version the workers negotiated

    assert clawq("grant", "time", "--agent", "main", "--deny", "convert_time").startswith(
        "granted time to agent main"
    )
    request_id = clawq("request", "web", "--user", "ann", "--allow", "search").strip()
    assert request_id in clawq("requests")
    assert clawq("review", request_id, "approve") == f"approved {request_id}\n"
    grants = clawq("grants")
    assert "convert_time" in grants and "ann" in grants and "search" in grants

    bad = runner.invoke(cli.main, ["mcp", "grant", "time"], env=isolated.env())
    assert bad.exit_code == 2 and "give exactly one of agent or user" in bad.output
    twice = runner.invoke(cli.main, ["mcp", "review", request_id, "reject"], env=isolated.env())
    assert twice.exit_code == 2 and "no pending access request" in twice.output
    broken = runner.invoke(cli.main, ["mcp", "add", '{"x": {"type": "sse"}}'], env=isolated.env())
    assert (
        broken.exit_code == 2 and "mcpServers.x: Value error, a sse server needs" in broken.output
    )
    assert clawq("remove", "web") == "removed web\n"
    assert "ann" not in clawq("grants")  # its grants went with it
