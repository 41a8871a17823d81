"""An agent job calls MCP tools through a real `mcp` worker: `mcp-server-time` over stdio,
granted in PostgreSQL; a denied tool is neither shown to the model nor executable."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Cluster, call, script, start_cluster, wait_until
from tests.orchestrator.conftest import ModelServer, openai_chunk, sse

TIME = str(Path(sys.executable).parent / "mcp-server-time")


@pytest.fixture(scope="module")
def server() -> Iterator[ModelServer]:
    with ModelServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def cluster(server: ModelServer) -> Iterator[Cluster]:
    for cluster in start_cluster(
        groups=("mcp",),
        mcp_health_interval_s=1,
        openai_base_url=f"{server.url}/v1",
        openai_api_key="sk-test",
    ):
        cluster.client.mcp.add({"mcpServers": {"time": {"command": TIME}}})
        cluster.client.mcp.grant("time", agent="main", deny=["convert_time"], by="test")
        # the worker connected and listed the server
        wait_until(lambda c=cluster: len(c.client.mcp.tools()) >= 2, what="the catalog")
        yield cluster


def test_a_job_calls_a_granted_mcp_tool(cluster: Cluster, workspace: Path) -> None:
    job = cluster.client.submit(
        "what time is it",
        workspace=str(workspace),
        script=script(
            {
                "tool_calls": [
                    call("now", "mcp_time__get_current_time", timezone="UTC"),
                    call("conv", "mcp_time__convert_time", source_timezone="UTC"),
                ]
            },
            {"text": "done"},
        ),
    )
    result = job.wait(timeout=60)
    now, conv = result.tool_calls
    assert not now.is_error and now.queue == "mcp" and now.worker.startswith("worker@")
    assert '"timezone": "UTC"' in now.output
    assert now.output.startswith("[untrusted content from MCP server 'time'")
    # not granted: not in the job's registry at all, so no worker ever sees the call
    assert conv.is_error and conv.decision == "deny:validation" and conv.worker == "orchestrator"
    assert conv.output.startswith(  # it exists: what grants it is said
        "Unknown tool 'mcp_time__convert_time'. It is the tool 'convert_time' of MCP server"
        " 'time', not granted to agent 'main': an admin grants it with `clawq mcp grant time"
    )
    assert "mcp_time__get_current_time" in conv.output


def test_other_agents_see_no_mcp_tools_and_the_model_sees_the_schema(
    cluster: Cluster, server: ModelServer, workspace: Path
) -> None:
    other = cluster.client.submit(
        "no grant",
        workspace=str(workspace),
        agent="other",
        script=script(
            {"tool_calls": [call("now", "mcp_time__get_current_time", timezone="UTC")]},
            {"text": "done"},
        ),
    )
    (denied,) = other.wait(timeout=60).tool_calls
    assert denied.is_error and denied.decision == "deny:validation"
    assert "mcp_" not in denied.output.partition("Available tools:")[2]

    server.reply_sse(sse((None, openai_chunk({"content": "ok"}, "stop")), done=True))
    start = len(server.requests)
    job = cluster.client.submit("hi", model="openai:gpt-test", workspace=str(workspace))
    assert job.wait(timeout=60).final_text == "ok"
    tools = {t["function"]["name"]: t["function"] for t in server.requests[start].body["tools"]}
    assert "mcp_time__convert_time" not in tools  # denied: not listed
    shown = tools["mcp_time__get_current_time"]
    assert "timezone" in shown["parameters"]["properties"]
    assert shown["description"]
