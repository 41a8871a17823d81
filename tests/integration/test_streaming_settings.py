"""Two settings of a streaming orchestrator, over the real stack and a local server
speaking OpenAI's streaming wire: `stream_model_deltas` false reads the same stream but
sends no `model_delta` (the text comes whole, in `model_text`; a chat's live answer, fed
by the same coalescing, still grows as it comes: a local Telegram Bot API), and
`model_connections` bounds the requests an orchestrator has open at once (httpx's
default, 100, made the 1,000 jobs of `make bench` (u) queue, and its pool scan them on
every request)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker import keys
from orchestrator.client.deltas import JobEnded, TextDelta
from tests.integration.conftest import Cluster, start_cluster, wait_until
from tests.integration.test_chat_preview import (
    TG_TOKEN,
    Provider,
    assert_growing_then_final,
    final_in_chat,
)
from tests.orchestrator.model_wire import Answer, Asked, WireServer, openai_call, streamed
from tests.sites import Site

WORDS = [f"w{i:02d} " for i in range(20)]
TEXT = "".join(WORDS)
DELAY_S = 0.1  # between words: a reply holds its connection for 2 s
CONNECTIONS = 3


def answer(asked: Asked) -> Answer:
    """`gpt-call` lists files first; then, and for every other model, the words."""
    called = any(m.get("role") == "tool" for m in asked.body["messages"])
    if asked.body.get("model") == "gpt-call" and not called:
        return openai_call("call_l", "list_files", {}, (10, 5))
    return streamed(asked, WORDS, DELAY_S)


@pytest.fixture(scope="module")
def server() -> Iterator[WireServer]:
    with WireServer(answer) as srv:
        yield srv


@pytest.fixture(scope="module")
def chats() -> Iterator[tuple[Provider, Site]]:
    seen = Provider()
    with Site({f"/bot{TG_TOKEN}/{m}": seen for m in ("sendMessage", "editMessageText")}) as site:
        yield seen, site


@pytest.fixture(scope="module")
def cluster(server: WireServer, chats: tuple[Provider, Site]) -> Iterator[Cluster]:
    _, site = chats
    os.environ["TEST_NODELTA_TG_TOKEN"] = TG_TOKEN
    tg = {"kind": "telegram", "token_env": "TEST_NODELTA_TG_TOKEN", "api_base": site.url}
    yield from start_cluster(
        groups=("fs", "messaging"),
        stream_model_deltas=False,
        model_connections=CONNECTIONS,
        openai_base_url=f"{server.url}/v1",
        openai_api_key="key-o",
        message_channels={"tg": tg | {"live_answers": True}},
        web_private_allow=[site.endpoint],
        chat_preview_interval_s=0.5,
    )


def test_without_deltas_the_text_comes_whole(cluster: Cluster, tmp_path: Any) -> None:
    job = cluster.client.submit("talk", model="openai:gpt-s", workspace=str(tmp_path))
    assert job.wait(timeout=30).final_text == TEXT
    types = [e.type for e in job.events()]
    assert "model_delta" not in types and types.count("model_text") == 1
    items = list(job.stream())
    assert [(d.text, d.final) for d in items if isinstance(d, TextDelta)] == [(TEXT, True)]
    assert isinstance(items[-1], JobEnded) and items[-1].status == "completed"


def test_without_deltas_a_turn_is_seen_starting_while_the_model_speaks(
    cluster: Cluster, tmp_path: Any
) -> None:
    """A turn's start rides on the job's next round trip, which for a reply without calls
    is the job's end: it goes on its own after a moment instead, while the reply (2 s)
    still streams."""
    job = cluster.client.submit("list, then talk", model="openai:gpt-call", workspace=str(tmp_path))

    def types() -> list[str]:
        stream = cluster.client.redis.xrange(keys.events(job.id))
        return [json.loads(fields[b"e"])["type"] for _, fields in stream]

    wait_until(lambda: "tool_call_finished" in types(), timeout=30)
    time.sleep(0.5)
    during = types()
    assert during.count("turn_started") == 2 and "model_text" not in during, during
    assert job.wait(timeout=30).final_text == TEXT


def test_without_deltas_a_chat_still_sees_the_answer_grow(
    cluster: Cluster, chats: tuple[Provider, Site], tmp_path: Path
) -> None:
    seen, _ = chats
    job = cluster.client.submit(
        "from the chat",
        model="openai:gpt-s",
        workspace=str(tmp_path),
        user="alice",
        channel="tg",
        chat_id="6001",
    )
    assert job.wait(timeout=30).final_text == TEXT
    assert "model_delta" not in [e.type for e in job.events()]
    got = final_in_chat(seen, "6001", TEXT, "editMessageText")
    assert len(got) >= 3  # sent, edited as it grew (2 s at 0.5 s apart), the final
    assert_growing_then_final(got, "editMessageText", TEXT)


def test_requests_beyond_model_connections_wait_for_one(
    cluster: Cluster, server: WireServer, tmp_path: Any
) -> None:
    """Six jobs at once, three connections: the fourth request reaches the server only
    once a reply (2 s long) has ended, and every job completes."""
    since = len(server.asked)
    jobs = [
        cluster.client.submit("talk", model="openai:gpt-s", workspace=str(tmp_path))
        for _ in range(2 * CONNECTIONS)
    ]
    assert [j.wait(timeout=60).final_text for j in jobs] == [TEXT] * len(jobs)
    arrived = sorted(a.at for a in server.asked[since:])
    assert len(arrived) == len(jobs)
    reply_s = DELAY_S * len(WORDS)
    gaps = [arrived[i + CONNECTIONS] - arrived[i] for i in range(len(jobs) - CONNECTIONS)]
    assert min(gaps) >= 0.9 * reply_s, gaps
