"""An agent job calls MCP tools through a real `mcp` worker: `mcp-server-time` over stdio,
granted in PostgreSQL; a denied tool is neither shown to the model nor executable. And the
reference server, server-everything: progress reaches the job's events, and an image
becomes an artifact of the job."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.errors import Invalid
from tests.integration.conftest import Cluster, call, script, start_cluster, wait_until
from tests.orchestrator.conftest import ModelServer, openai_chunk, sse

TIME = str(Path(sys.executable).parent / "mcp-server-time")
EVERYTHING = Path(__file__).resolve().parents[1] / "mcp_servers" / "everything"
EVERYTHING_BIN = str(EVERYTHING / "node_modules" / ".bin" / "mcp-server-everything")


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
        everything = {"command": EVERYTHING_BIN, "args": ["stdio"], "idle_timeout_s": 2}
        cluster.client.mcp.add({"mcpServers": {"ev": everything}})
        cluster.client.mcp.grant("ev", agent="main", by="test")
        ours = {"command": sys.executable, "args": ["-m", "tests.mcp_servers.web_server", "stdio"]}
        cluster.client.mcp.add({"mcpServers": {"py": ours}})
        cluster.client.mcp.grant("py", agent="main", by="test")
        # the worker connected and listed the servers
        wanted = {"mcp_time__get_current_time", "mcp_ev__echo", "mcp_py__hold"}
        wait_until(
            lambda c=cluster, w=wanted: w <= {t.exposed_name for t in c.client.mcp.tools()},
            what="the catalog",
        )
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


def test_progress_becomes_events_and_an_image_an_artifact(
    cluster: Cluster, workspace: Path
) -> None:
    job = cluster.client.submit(
        "work long, then show me",
        workspace=str(workspace),
        script=script(
            {
                "tool_calls": [
                    call("long", "mcp_ev__trigger-long-running-operation", duration=4, steps=8)
                ]
            },
            {"tool_calls": [call("img", "mcp_ev__get-tiny-image")]},
            {"text": "done"},
        ),
    )
    result = job.wait(timeout=90)
    long, img = result.tool_calls
    assert not long.is_error and "Long running operation completed" in long.output
    progress = [e.data for e in job.events() if e.type == "tool_call_progress"]
    assert [(p["call_id"], p["progress"], p["total"]) for p in progress] == [
        ("long", n, 8) for n in range(1, 9)
    ]  # 4 s in all: alive past the idle limit of 2 s by its progress
    found = re.search(r"\[image: artifact (art_[0-9a-f]+) \(image/png, (\d+) bytes", img.output)
    assert found and not img.is_error, img.output
    row = cluster.client.store.conn.execute(
        "SELECT mime, size, job_id FROM artifacts WHERE id = %s", (found.group(1),)
    ).fetchone()
    assert row is not None and row["job_id"] == job.id and row["size"] == int(found.group(2))
    listed = {s.name: s for s in cluster.client.mcp.status()}
    assert listed["ev"].protocol_version == "2025-11-25"


def test_a_servers_prompt_is_a_jobs_system_prompt(
    cluster: Cluster, server: ModelServer, workspace: Path
) -> None:
    system = cluster.client.mcp.prompt("ev", "simple-prompt")  # `clawq run --mcp-prompt`
    server.reply_sse(sse((None, openai_chunk({"content": "ok"}, "stop")), done=True))
    start = len(server.requests)
    job = cluster.client.submit(
        "hi", model="openai:gpt-test", workspace=str(workspace), system=system
    )
    assert job.wait(timeout=60).final_text == "ok"
    first = server.requests[start].body["messages"][0]
    assert first["role"] == "system"
    assert "This is a simple prompt without arguments." in first["content"]
    with pytest.raises(Invalid, match="needs arguments \\(city\\): a job gets it with"):
        cluster.client.mcp.prompt("ev", "args-prompt")


def test_cancelling_the_job_cancels_the_call_on_the_server(
    cluster: Cluster, workspace: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "cancelled"
    job = cluster.client.submit(
        "hold on",
        workspace=str(workspace),
        script=script(
            {"tool_calls": [call("h", "mcp_py__hold", marker=str(marker))]}, {"text": "never"}
        ),
    )
    wait_until(lambda: (tmp_path / "cancelled.started").exists(), what="the tool started")
    job.cancel()
    wait_until(marker.exists, what="the server told of the cancel")
    assert job.wait(timeout=60).status == "cancelled"
