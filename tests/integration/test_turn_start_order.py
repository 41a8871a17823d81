"""A turn's start is on its job's stream before anything of the turn, though the model is
asked without a round trip first: the start rides on the turn's first call or on its first
model delta. Over the real stack and a local server speaking OpenAI's streaming wire: the
first turn lists files (its start goes with the call), the second streams words, each
sent as a delta of its own at once (`stream_delta_max_chars` 1), well before a held start
would go on its own (20 ms)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from broker import keys
from tests.integration.conftest import Cluster, start_cluster
from tests.orchestrator.model_wire import Answer, Asked, WireServer, openai_call, streamed

WORDS = [f"w{i} " for i in range(8)]


def answer(asked: Asked) -> Answer:
    if not any(m.get("role") == "tool" for m in asked.body["messages"]):
        return openai_call("call_l", "list_files", {}, (10, 5))
    return streamed(asked, WORDS, 0.0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with WireServer(answer) as server:
        yield from start_cluster(
            groups=("fs",),
            openai_base_url=f"{server.url}/v1",
            openai_api_key="key-o",
            stream_model_deltas=True,
            stream_delta_max_chars=1,
        )


def test_each_turn_starts_on_the_stream_before_its_call_and_its_deltas(
    cluster: Cluster, tmp_path: Any
) -> None:
    for _ in range(3):
        job = cluster.client.submit(
            "list, then talk", model="openai:gpt-x", workspace=str(tmp_path)
        )
        assert job.wait(timeout=30).final_text == "".join(WORDS)
        stream = cluster.client.redis.xrange(keys.events(job.id))
        events = [json.loads(fields[b"e"]) for _, fields in stream]
        starts = {e["data"]["turn"]: i for i, e in enumerate(events) if e["type"] == "turn_started"}
        assert sorted(starts) == [1, 2]
        queued = [i for i, e in enumerate(events) if e["type"] == "tool_call_queued"]
        deltas = [i for i, e in enumerate(events) if e["type"] == "model_delta"]
        assert {events[i]["data"]["turn"] for i in deltas} == {2}
        assert len(deltas) >= len(WORDS) // 2  # sent as they came, not whole at the end
        assert starts[1] < min(queued) < starts[2] < min(deltas), [e["type"] for e in events]
