"""The debounced announce queue on a real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from broker.announce import AnnounceQueue, batch_message
from tests.conftest import Isolated


@pytest.fixture
def client(isolated: Isolated) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(isolated.redis_url) as conn:
        yield conn


def item(n: int) -> dict[str, object]:
    return {"child": f"c{n}", "label": f"task {n}", "status": "completed", "result": f"r{n}"}


def test_each_arrival_resets_the_debounce(client: redis.Redis) -> None:
    queue = AnnounceQueue(client, debounce_s=1.0, drain_at=20)
    queue.push("p", item(1), now=100.0)
    queue.push("p", item(2), now=100.6)
    assert queue.take_due(now=101.2) == {}  # 1 s after the last arrival, not the first
    queue.push("p", item(3), now=101.4)
    assert queue.take_due(now=102.3) == {}
    due = queue.take_due(now=102.5)
    assert [i["child"] for i in due["p"]] == ["c1", "c2", "c3"]  # one batch, arrival order
    assert queue.take_due(now=200) == {} and queue.next_due() is None


def test_a_full_batch_is_due_at_once(client: redis.Redis) -> None:
    queue = AnnounceQueue(client, debounce_s=1.0, drain_at=3)
    for n in range(3):
        queue.push("p", item(n), now=100.0)
    assert len(queue.take_due(now=100.0)["p"]) == 3


def test_a_batch_goes_to_exactly_one_taker(client: redis.Redis, isolated: Isolated) -> None:
    queue = AnnounceQueue(client)
    for parent in ("a", "b"):
        queue.push(parent, item(1), now=1.0)
    with redis.Redis.from_url(isolated.redis_url) as other_client:
        other = AnnounceQueue(other_client)
        first = other.take_due(now=10.0)
        second = queue.take_due(now=10.0)
    assert set(first) == {"a", "b"} and second == {}


def test_messages() -> None:
    assert batch_message([item(1)]) == "[subagent task 1 completed]\nr1"
    text = batch_message([item(1), item(2)])
    assert text.startswith("2 subagents finished:") and "1. [subagent task 1" in text
    assert "2. [subagent task 2 completed]\nr2" in text
