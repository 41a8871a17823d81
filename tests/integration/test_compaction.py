"""Context management through the whole stack, against a local OpenAI-wire server that
refuses any request over LIMIT tokens (as a real model does past its context window): a
200-turn job completes, its older turns compacted into summaries, and its transcript
keeps every original turn. A long tool result is sent cut, and the model follows the
pointer (read_result) to the rest."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from orchestrator.job.context import SUMMARY_SYSTEM
from tests.integration.conftest import Cluster, start_cluster
from tests.orchestrator.model_wire import Answer, Asked, WireServer, error, openai_call, text

LIMIT = 6000  # tokens the server accepts in one request
TURNS = 200
FOLLOW_AT = 5  # the turn whose reply follows the pointer of the cut result before it
POINTER = re.compile(r'read_result\(call_id="([^"]+)", turn=(\d+), start_index=(\d+)\)')
BIG = "".join(f"line {i:04d} of the big file\n" for i in range(100)) + "THE END\n"


def orphans(messages: list[dict[str, Any]]) -> str:
    """The id of a tool result whose call is not in the assistant message before it."""
    called: set[str] = set()
    for m in messages:
        if m["role"] == "assistant":
            called = {c["id"] for c in m.get("tool_calls") or []}
        elif m["role"] == "tool" and m["tool_call_id"] not in called:
            return str(m["tool_call_id"])
        elif m["role"] != "tool":
            called = set()
    return ""


class ContextLimited:
    """The server's side: counts tokens as 4 characters each, refuses over LIMIT."""

    def __init__(self, last: int = TURNS, counts: bool = True) -> None:
        self.last = last  # the turn that ends the job
        self.counts = counts  # the usage says how many tokens the request held
        self.turns = 0
        self.summaries = 0
        self.refused = 0
        self.largest = 0
        self.followed: dict[str, Any] = {}
        self.lock = threading.Lock()

    def __call__(self, asked: Asked) -> Answer:
        body = asked.body
        if orphan := orphans(body["messages"]):  # as OpenAI refuses them
            with self.lock:
                self.refused += 1
            return error(400, f"messages with role 'tool' must answer tool_calls: {orphan}")
        size = len(json.dumps(body["messages"])) + len(json.dumps(body.get("tools", [])))
        tokens = size // 4
        said = tokens if self.counts else 0
        with self.lock:
            self.largest = max(self.largest, tokens)
            if tokens > LIMIT:
                self.refused += 1
                return error(
                    400,
                    f"This model's maximum context length is {LIMIT} tokens "
                    f"(context_length_exceeded); you sent {tokens}",
                )
            if body["messages"][0]["content"] == SUMMARY_SYSTEM:
                self.summaries += 1
                return text(
                    asked, f"Summary {self.summaries}: read big.txt many times.", (said, 20)
                )
            self.turns += 1
            turn = self.turns
        if turn == self.last:
            return text(asked, f"read it {turn - 1} times", (said, 5))
        if turn == FOLLOW_AT + 1 and self.counts:
            last = body["messages"][-1]["content"]
            call_id, at_turn, start = POINTER.search(last).groups()  # type: ignore[union-attr]
            self.followed = {"call_id": call_id, "turn": int(at_turn), "start_index": int(start)}
            return openai_call(f"c{turn}", "read_result", self.followed, (said, 20))
        # the whole file each time (a limit above its length), never the same call twice
        return openai_call(
            f"c{turn}", "read_file", {"path": "big.txt", "limit": 500 + turn}, (said, 20)
        )


@pytest.fixture(scope="module")
def model() -> ContextLimited:
    return ContextLimited()


@pytest.fixture(scope="module")
def cluster(model: ContextLimited) -> Iterator[Cluster]:
    with WireServer(model) as server:
        yield from start_cluster(
            groups=("fs", "sessions"),
            openai_base_url=f"{server.url}/v1",
            openai_api_key="sk-test",
            model_context_windows={"gpt-ctx": LIMIT},
            tool_result_context_chars=1000,
            tool_policy={"allow": ["read_file", "read_result"]},
            rate_limit_per_hour=0,  # 200 calls in a minute
            max_iterations=TURNS + 10,
        )


def test_a_200_turn_job_completes_within_the_window_and_keeps_every_turn(
    cluster: Cluster, model: ContextLimited, workspace: Path
) -> None:
    (workspace / "big.txt").write_text(BIG)
    job = cluster.client.submit(
        "read big.txt again and again",
        model="openai:gpt-ctx",
        workspace=str(workspace),
        max_iterations=TURNS + 10,
    )
    result = job.wait(timeout=600)
    assert (result.status, result.final_text) == ("completed", "read it 199 times"), result.error
    assert result.iterations == TURNS
    assert model.refused == 0 and model.largest <= LIMIT  # compacted before, never refused
    assert model.summaries >= 5
    with psycopg.connect(cluster.iso.database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT role, content FROM messages WHERE job_id = %s ORDER BY seq", (job.id,)
        ).fetchall()
    roles = [r[0] for r in rows]
    assert roles.count("assistant") == TURNS and roles.count("tool") == TURNS - 1
    compacted = roles.count("compaction")
    assert roles.count("user") == 1 and 5 <= compacted <= model.summaries
    tools = [r[1]["results"][0] for r in rows if r[0] == "tool"]
    reads = [t for t in tools if t["name"] == "read_file"]
    bad = [t for t in reads if "THE END" not in t["content"]]
    assert len(reads) == TURNS - 2 and not bad, bad[:2]  # whole
    compactions = [r[1] for r in rows if r[0] == "compaction"]
    assert all(c["text"].startswith("Summary ") and c["covers"] > 0 for c in compactions)
    covers = [c["covers"] for c in compactions]
    assert covers == sorted(covers)  # each covers more than the one before
    # the cut result's pointer was followed: the rest of the file, from where it was cut
    assert model.followed["start_index"] == 1000
    followed = next(t for t in tools if t["name"] == "read_result")
    pointed = next(t for t in tools if t["call_id"] == model.followed["call_id"])
    assert followed["content"].startswith(pointed["content"][1000:1100])
    assert followed["content"].endswith("call again with start_index=1900]")  # a page on
    events = [e.type for e in job.events()]
    assert events.count("context_compacted") == compacted


def test_a_request_refused_as_too_long_is_compacted_and_sent_again(
    workspace: Path,
) -> None:
    """A provider that never says what a request counted, and an estimate a hundred times too
    low: the job learns from the refusal (the request held more tokens than the window),
    compacts, and asks again."""
    model = ContextLimited(last=40, counts=False)
    with WireServer(model) as server:
        for cluster in start_cluster(
            groups=("fs",),
            openai_base_url=f"{server.url}/v1",
            openai_api_key="sk-test",
            model_context_windows={"gpt-ctx": LIMIT},
            context_chars_per_token=400.0,
            tool_result_context_chars=1000,
            tool_policy={"allow": ["read_file"]},
        ):
            (workspace / "big.txt").write_text(BIG)
            job = cluster.client.submit(
                "read", model="openai:gpt-ctx", workspace=str(workspace), max_iterations=50
            )
            result = job.wait(timeout=300)
    assert (result.status, result.final_text) == ("completed", "read it 39 times"), result.error
    assert model.refused >= 1 and model.summaries >= 1
