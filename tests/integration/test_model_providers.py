"""Agent jobs driven by the real OpenAI and Anthropic providers, through the whole stack,
against recorded wire-format streams served by a local HTTP server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Cluster, start_cluster
from tests.orchestrator.conftest import ModelServer, openai_chunk, sse, tool_delta


def openai(delta: dict[str, Any], finish: str | None = None) -> tuple[None, dict[str, Any]]:
    return None, openai_chunk(delta, finish)


@pytest.fixture(scope="module")
def server() -> Iterator[ModelServer]:
    with ModelServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def cluster(server: ModelServer) -> Iterator[Cluster]:
    yield from start_cluster(
        openai_base_url=f"{server.url}/v1",
        openai_api_key="sk-test",
        anthropic_base_url=server.url,
        anthropic_api_key="ak-test",
    )


def test_openai_job(cluster: Cluster, server: ModelServer, workspace: Path) -> None:
    args = json.dumps({"path": "hello.txt", "content": "hi from openai"})
    server.reply_sse(
        sse(
            *[
                openai({"role": "assistant", "content": "Writing it."}),
                openai(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_abc",
                                "type": "function",
                                "function": {"name": "write_file", "arguments": ""},
                            }
                        ]
                    }
                ),
                openai({"tool_calls": [{"index": 0, "function": {"arguments": args[:12]}}]}),
                openai({"tool_calls": [{"index": 0, "function": {"arguments": args[12:]}}]}),
                openai({}, finish="tool_calls"),
            ],
            done=True,
        )
    )
    server.reply_sse(sse(openai({"content": "Done: hello.txt"}), openai({}, "stop"), done=True))
    start = len(server.requests)
    job = cluster.client.submit("write hello", model="openai:gpt-test", workspace=str(workspace))
    result = job.wait(timeout=60)
    assert (result.status, result.final_text) == ("completed", "Done: hello.txt")
    assert (workspace / "hello.txt").read_text() == "hi from openai"
    first, second = server.requests[start:]
    assert first.path == "/v1/chat/completions" and first.body["model"] == "gpt-test"
    assert {t["function"]["name"] for t in first.body["tools"]} >= {"write_file", "exec"}
    assistant, tool = second.body["messages"][-2:]
    assert assistant["tool_calls"][0]["id"] == "call_abc"
    assert tool == {
        "role": "tool",
        "tool_call_id": "call_abc",
        "content": "wrote 14 bytes to hello.txt",
    }


def test_anthropic_job(cluster: Cluster, server: ModelServer, workspace: Path) -> None:
    (workspace / "notes.md").write_text("- milk\n")
    start_msg = {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude",
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        },
    }
    server.reply_sse(
        sse(
            *[
                ("message_start", start_msg),
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": 0,
                        "content_block": {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "read_file",
                            "input": {},
                        },
                    },
                ),
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "input_json_delta", "partial_json": '{"path": "no'},
                    },
                ),
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "input_json_delta", "partial_json": 'tes.md"}'},
                    },
                ),
                ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                (
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": "tool_use"},
                        "usage": {"output_tokens": 20},
                    },
                ),
                ("message_stop", {"type": "message_stop"}),
            ]
        )
    )
    server.reply_sse(
        sse(
            *[
                ("message_start", start_msg),
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": 0,
                        "content_block": {"type": "text", "text": ""},
                    },
                ),
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": "One item: milk."},
                    },
                ),
                ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                ("message_stop", {"type": "message_stop"}),
            ]
        )
    )
    start = len(server.requests)
    job = cluster.client.submit("what's in my notes?", model="anthropic", workspace=str(workspace))
    result = job.wait(timeout=60)
    assert (result.status, result.final_text) == ("completed", "One item: milk.")
    first, second = server.requests[start:]
    assert first.path == "/v1/messages" and first.headers["x-api-key"] == "ak-test"
    result_block = second.body["messages"][-1]["content"][0]
    assert result_block["type"] == "tool_result" and result_block["tool_use_id"] == "toolu_1"
    assert "- milk" in result_block["content"] and result_block["is_error"] is False


def test_provider_error_fails_the_job_clearly(
    cluster: Cluster, server: ModelServer, workspace: Path
) -> None:
    server.reply_json(401, {"error": {"message": "invalid api key"}})
    job = cluster.client.submit("x", model="openai", workspace=str(workspace))
    result = job.wait(timeout=60)
    assert result.status == "failed"
    assert "HTTP 401" in result.error and "invalid api key" in result.error


def finished_calls(job: Any, wanted: str) -> list[str]:
    """The ids of the job's finished calls, read from its events up to `wanted`'s."""
    seen = []
    for event in job.events():
        if event.type == "tool_call_finished":
            seen.append(event.data["call_id"])
            if event.data["call_id"] == wanted:
                break
    return seen


def test_a_streamed_read_starts_before_the_stream_ends_and_a_write_after(
    cluster: Cluster, server: ModelServer, workspace: Path
) -> None:
    (workspace / "seed.txt").write_text("seeded before the job")
    write = json.dumps({"path": "first.txt", "content": "written after the stream"})
    release = server.reply_sse(
        sse(
            openai({"role": "assistant", "content": "Three calls."}),
            openai(tool_delta(0, "call_read", "read_file", json.dumps({"path": "seed.txt"}))),
            openai(tool_delta(1, "call_write", "write_file", write)),
            openai(tool_delta(2, "call_third", "read_file", json.dumps({"path": "first.txt"}))),
            openai({}, finish="tool_calls"),
            done=True,
        ),
        hold_after="call_third",  # the stream pauses once the read and the write are complete
    )
    server.reply_sse(sse(openai({"content": "ok"}), openai({}, "stop"), done=True))
    job = cluster.client.submit("stream", model="openai", workspace=str(workspace))
    target = workspace / "first.txt"
    read_during_stream = finished_calls(job, "call_read") == ["call_read"] and not server.holds
    time.sleep(1.0)  # a write sent early would have run by now: it waits for the turn
    written_during_stream = target.exists()
    still_held = not server.holds
    release.set()
    result = job.wait(timeout=60)
    assert read_during_stream  # a worker ran the read while the model was still streaming
    assert still_held and not written_during_stream
    assert result.status == "completed"
    assert [c.id for c in result.tool_calls] == ["call_read", "call_write", "call_third"]
    assert "seeded before the job" in result.tool_calls[0].output
    assert "written after the stream" in result.tool_calls[2].output


def test_a_write_of_a_stream_that_breaks_off_never_runs(
    cluster: Cluster, server: ModelServer, workspace: Path
) -> None:
    write = json.dumps({"path": "never.txt", "content": "must not be written"})
    release = server.reply_sse(
        sse(
            openai(tool_delta(0, "call_write", "write_file", write)),
            openai(tool_delta(1, "call_more", "read_file")),
            (None, {"error": {"message": "The server had an error", "type": "server_error"}}),
        ),
        hold_after="call_more",  # the write is complete; the stream breaks off after this
    )
    job = cluster.client.submit("stream then break", model="openai", workspace=str(workspace))
    time.sleep(1.0)
    release.set()
    result = job.wait(timeout=60)
    time.sleep(0.5)
    assert result.status == "failed"
    assert "server_error" in result.error
    assert not (workspace / "never.txt").exists()  # its turn was never stored: never sent


@pytest.mark.parametrize(
    ("tool", "given"), [("write_file", {"path": "slow.txt", "content": "x"}), ("list_files", {})]
)
def test_results_are_stored_while_a_slow_model_thinks(
    cluster: Cluster, server: ModelServer, workspace: Path, tool: str, given: dict[str, str]
) -> None:
    """A turn's results wait for the model's next message to share its write, but not for
    longer than `results_write_delay_s`: a slow model does not keep them out of the store.
    A turn that only reads is asked on from before its own write is waited for: its
    results are written after that write, on time all the same."""
    import psycopg

    call = {"index": 0, "id": "call_w", "type": "function"}
    call["function"] = {"name": tool, "arguments": json.dumps(given)}
    server.reply_sse(
        sse(openai({"role": "assistant", "tool_calls": [call]}), openai({}, "tool_calls"))
    )
    release = server.reply_sse(
        sse(openai({"content": "thinking"}), openai({"content": " done"}), openai({}, "stop")),
        hold_after="thinking",
    )
    ended = len(server.holds)  # held replies of earlier tests that have ended
    job = cluster.client.submit("slow", model="openai", workspace=str(workspace))
    with psycopg.connect(cluster.iso.database_url, autocommit=True) as conn:

        def stored() -> tuple[str | None, list[str]]:
            row = conn.execute(
                "SELECT status FROM tool_calls WHERE job_id = %s AND call_id = 'call_w'",
                (job.id,),
            ).fetchone()
            roles = conn.execute(
                "SELECT role FROM messages WHERE job_id = %s ORDER BY seq", (job.id,)
            ).fetchall()
            return (row[0] if row else None), [r[0] for r in roles]

        deadline = time.monotonic() + 20
        while stored()[0] != "done" and time.monotonic() < deadline:
            time.sleep(0.05)
        during = stored()
        held = len(server.holds) == ended  # the model's second reply had not ended meanwhile
    release.set()
    result = job.wait(timeout=60)
    assert held and during == ("done", ["user", "assistant", "tool"])
    assert result.status == "completed" and result.final_text == "thinking done"
    written = (workspace / "slow.txt").read_text() if tool == "write_file" else None
    assert written == given.get("content")
