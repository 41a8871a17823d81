"""The README's MCP setup as a new user meets it (issue 30): a stdio command given by its
bare name is found though the stack's PATH lacks the venv (the console scripts beside the
interpreter), a server that cannot start says why in `clawq mcp list` and in the log, and a
job calling a tool that exists but is not granted is told how it is granted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli import main as cli
from orchestrator.cli.local.stack import Stack
from orchestrator.client import Client
from tests.conftest import Isolated
from tests.integration.conftest import call, script, wait_until

BARE = {"mcpServers": {"time": {"command": "mcp-server-time"}}}  # as the README says
BROKEN = {"mcpServers": {"broken": {"command": "no-such-mcp-server"}}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Isolated, Client, Path]]:
    settings = {"mcp_health_interval_s": 1, "mcp_reconnect_initial_s": 0.2}
    iso = Isolated(**settings)
    log_path = tmp_path_factory.mktemp("mcp") / "stack.log"
    env = {
        **iso.env(),
        **{f"CLAWQ_{k.upper()}": str(v) for k, v in settings.items()},
        "PATH": "/usr/bin:/bin",  # as `.venv/bin/clawq up` without the venv activated
    }
    with log_path.open("wb") as log:
        proc_stack = Stack(["mcp"], env=env, log=log, concurrency=1)
        proc_stack.start()
        client = Client(iso.settings)
        try:
            proc_stack.wait_ready(iso.redis_url)
            client.mcp.add(BARE)
            client.mcp.add(BROKEN)
            yield iso, client, log_path
        finally:
            client.close()
            proc_stack.stop()
            iso.drop()


def test_a_bare_command_is_found_beside_the_interpreter(
    stack: tuple[Isolated, Client, Path],
) -> None:
    _, client, _ = stack
    tools = wait_until(lambda: client.mcp.tools(), 30, "the time server's tools")
    assert "mcp_time__get_current_time" in {t.exposed_name for t in tools}
    # the worker stores the listed tools, then the state it reached: read after them
    wait_until(lambda: client.mcp.states()["time"].state == "connected", 30, "time connected")


def test_a_server_that_cannot_start_says_why_in_mcp_list_and_the_log(
    stack: tuple[Isolated, Client, Path],
) -> None:
    iso, client, log_path = stack
    wait_until(lambda: client.mcp.states()["broken"].state, 30, "a state for broken")
    wait_until(lambda: client.mcp.states()["time"].state, 30, "a state for time")
    listed = CliRunner().invoke(cli.main, ["mcp", "list", "--json"], env=iso.env())
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert rows["broken"]["state"] in ("retrying", "failed")
    assert rows["broken"]["error"].startswith(
        "command 'no-such-mcp-server' not found on the PATH (/usr/bin:/bin:"
    )
    assert rows["time"]["state"] == "connected" and rows["time"]["error"] == ""
    logged = log_path.read_text()
    assert "MCP server broken did not start (attempt 1 of 10, again in " in logged
    assert "command 'no-such-mcp-server' not found on the PATH" in logged


def test_a_tool_not_granted_is_named_with_the_grant_command(
    stack: tuple[Isolated, Client, Path], workspace: Path
) -> None:
    _, client, _ = stack
    wait_until(lambda: client.mcp.tools(), 30, "the time server's tools")
    job = client.submit(
        "what time is it",
        workspace=str(workspace),
        script=script(
            {"tool_calls": [call("t", "mcp_time__get_current_time", timezone="UTC")]},
            {"text": "done"},
        ),
    )
    (refused,) = job.wait(timeout=60).tool_calls
    assert refused.is_error and refused.decision == "deny:validation"
    assert refused.output.startswith(
        "Unknown tool 'mcp_time__get_current_time'. It is the tool 'get_current_time' of MCP"
        " server 'time', not granted to agent 'main': an admin grants it with `clawq mcp grant"
        " time --agent main`"
    )
