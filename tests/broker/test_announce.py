"""The debounced announce queue on a real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from broker import keys
from broker.redis.announce import AnnounceItem, AnnounceQueue, batch_message
from tests.conftest import Isolated


@pytest.fixture
def client(isolated: Isolated) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(isolated.redis_url) as conn:
        yield conn


def item(n: int) -> AnnounceItem:
    return AnnounceItem(child=f"c{n}", label=f"task {n}", status="completed", result=f"r{n}")


def test_each_arrival_resets_the_debounce(client: redis.Redis) -> None:
    queue = AnnounceQueue(client, debounce_s=1.0, drain_at=20)
    queue.push("p", item(1), now=100.0)
    queue.push("p", item(2), now=100.6)
    assert queue.claim_due(now=101.2) == {}  # 1 s after the last arrival, not the first
    queue.push("p", item(3), now=101.4)
    assert queue.claim_due(now=102.3) == {}
    due = queue.claim_due(now=102.5)
    assert [i.child for i in due["p"]] == ["c1", "c2", "c3"]  # one batch, arrival order
    queue.ack("p", 3)
    assert queue.claim_due(now=200) == {} and queue.next_due() is None


def test_a_full_batch_is_due_at_once(client: redis.Redis) -> None:
    queue = AnnounceQueue(client, debounce_s=1.0, drain_at=3)
    for n in range(3):
        queue.push("p", item(n), now=100.0)
    assert len(queue.claim_due(now=100.0)["p"]) == 3


def test_a_batch_goes_to_exactly_one_taker(client: redis.Redis, isolated: Isolated) -> None:
    queue = AnnounceQueue(client)
    for parent in ("a", "b"):
        queue.push(parent, item(1), now=1.0)
    with redis.Redis.from_url(isolated.redis_url) as other_client:
        other = AnnounceQueue(other_client)
        first = other.claim_due(now=10.0)
        second = queue.claim_due(now=10.0)
    assert set(first) == {"a", "b"} and second == {}


def test_an_unacknowledged_claim_is_due_again(client: redis.Redis) -> None:
    """A claimer that died before delivering leaves the batch to the next one."""
    queue = AnnounceQueue(client, hold_s=30.0)
    queue.push("p", item(1), now=1.0)
    assert list(queue.claim_due(now=5.0)) == ["p"]
    assert queue.claim_due(now=20.0) == {}
    assert [i.child for i in queue.claim_due(now=40.0)["p"]] == ["c1"]


def test_delivery_goes_to_the_running_job_or_to_the_caller(client: redis.Redis) -> None:
    queue = AnnounceQueue(client)
    queue.push("s", item(1), now=1.0)
    queue.claim_due(now=5.0)
    assert queue.deliver("s", 1, "hello") is None  # nothing runs in s: the caller starts one
    client.set(keys.session_active("s"), "job-7")
    queue.push("s", item(2), now=6.0)  # arrives while the first is being delivered
    assert queue.deliver("s", 1, "both") == "job-7"
    assert client.lrange(keys.inbox("job-7"), 0, -1) == [b"both"]
    assert [i.child for i in queue.claim_due(now=10.0)["s"]] == ["c2"]  # still queued


def test_messages() -> None:
    message = AnnounceItem(kind="message", sender="s1", result="hi")
    assert batch_message([message]) == "[message from session s1]\nhi"
    assert batch_message([item(1), message]).startswith("2 announcements:")
    assert batch_message([item(1)]) == "[subagent task 1 completed]\nr1"
    text = batch_message([item(1), item(2)])
    assert text.startswith("2 subagents finished:") and "1. [subagent task 1" in text
    assert "2. [subagent task 2 completed]\nr2" in text


def test_a_job_that_has_not_ended_takes_the_batch_in_its_inbox(client: redis.Redis) -> None:
    queue = AnnounceQueue(client)
    queue.push("s", item(1), now=1.0)
    queue.claim_due(now=5.0)
    assert queue.deliver_to_job("job-1", "s", 1, "one")  # queued, not yet started
    assert client.lrange(keys.inbox("job-1"), 0, -1) == [b"one"]
    assert queue.claim_due(now=100.0) == {}  # delivered: nothing left
    client.set(keys.released("job-2"), 1)  # job-2 has ended and handed its inbox back
    queue.push("s", item(2), now=6.0)
    queue.claim_due(now=10.0)
    assert not queue.deliver_to_job("job-2", "s", 1, "two")
    assert not client.exists(keys.inbox("job-2"))
    queue.retry_soon("s", 0.5, now=10.0)
    assert [i.child for i in queue.claim_due(now=10.6)["s"]] == ["c2"]  # due again soon
