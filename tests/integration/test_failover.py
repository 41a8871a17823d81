"""Failover through the whole stack, two orchestrators: a job's chain of models, each with
several credentials, against a local server speaking both wires that answers 429 with
retry-after, 529 and 500. The job completes on the second credential, then on the second
model; its events name them (by label), its budget charges the model that answered, and
the credential that got 429 rests for both orchestrators."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis

from broker import keys
from tests.integration.conftest import Cluster, start_cluster
from tests.orchestrator.model_wire import Answer, Asked, WireServer, error, text

ENV = {"FAILOVER_A1": "key-a1", "FAILOVER_A2": "key-a2", "FAILOVER_O1": "key-o1"}
CHAIN = "anthropic:claude-a,openai:gpt-b"
PRICES = {"claude-a": [1000.0, 1000.0], "gpt-b": [10.0, 10.0]}  # dollars per 1M tokens

# what each key answers now (the tests change it)
MODES: dict[str, Any] = {}


def answer(asked: Asked) -> Answer:
    mode = MODES.get(asked.key, "ok")
    return (
        mode(asked)
        if callable(mode)
        else text(asked, f"answered with {asked.key[-2:].upper()}", (100, 50))
    )


@pytest.fixture(scope="module")
def server() -> Iterator[WireServer]:
    with WireServer(answer) as srv:
        yield srv


@pytest.fixture(scope="module")
def cluster(server: WireServer) -> Iterator[Cluster]:
    os.environ.update(ENV)  # the orchestrators inherit the keys' variables
    try:
        yield from start_cluster(
            orchestrators=2,
            anthropic_base_url=server.url,
            openai_base_url=f"{server.url}/v1",
            model_credentials=[
                {"provider": "anthropic", "label": "a1", "api_key_env": "FAILOVER_A1"},
                {"provider": "anthropic", "label": "a2", "api_key_env": "FAILOVER_A2"},
                {"provider": "openai", "label": "o1", "api_key_env": "FAILOVER_O1"},
            ],
            model_retry_attempts=2,
            model_retry_initial_s=0.05,
            model_retry_max_s=0.1,
            model_prices=PRICES,
        )
    finally:
        for name in ENV:
            os.environ.pop(name, None)


def failovers(events: list[Any]) -> list[tuple[str, str, int]]:
    return [
        (e.data["model"], e.data["credential"], e.data["status"])
        for e in events
        if e.type == "model_failover"
    ]


def answered(events: list[Any]) -> list[tuple[str, str]]:
    return [(e.data["model"], e.data["credential"]) for e in events if e.type == "model_answered"]


def test_completes_on_the_second_credential_then_the_second_model(
    cluster: Cluster, server: WireServer, tmp_path: Any
) -> None:
    MODES.clear()
    MODES["key-a1"] = lambda a: error(429, "rate limited", retry_after="60")
    start = len(server.asked)
    job = cluster.client.submit("hi", model=CHAIN, workspace=str(tmp_path), budget={"turns": 50})
    result = job.wait(timeout=60)
    assert (result.status, result.final_text) == ("completed", "answered with A2")
    events = list(job.events())
    assert failovers(events) == [("anthropic:claude-a", "a1", 429)]
    assert answered(events) == [("anthropic:claude-a", "a2")]
    assert server.keys(start) == ["key-a1", "key-a2"]
    # the budget charged claude-a's price for what a2 used (100 in, 50 out)
    assert result.usage is not None and result.usage.tokens == 150
    assert result.usage.cost_usd == pytest.approx(0.15)
    assert not any("key-a" in str(e.data) for e in events)  # labels, never keys
    rest = redis.Redis.from_url(cluster.iso.redis_url).pttl(keys.cooldown("anthropic", "a1"))
    assert rest > 30_000

    # a2 overloaded (529, then 500 on its retry), a1 resting: the second model answers
    count = {"n": 0}

    def a2(asked: Asked) -> Answer:
        count["n"] += 1
        return error(529 if count["n"] % 2 else 500, "overloaded")

    MODES["key-a2"] = a2
    start = len(server.asked)
    job = cluster.client.submit("hi", model=CHAIN, workspace=str(tmp_path), budget={"turns": 50})
    result = job.wait(timeout=60)
    assert (result.status, result.final_text) == ("completed", "answered with O1")
    events = list(job.events())
    assert failovers(events) == [("anthropic:claude-a", "a2", 500)]
    assert answered(events) == [("openai:gpt-b", "o1")]
    assert server.keys(start) == ["key-a2", "key-a2", "key-o1"]  # a1 rests: not asked
    assert result.usage is not None
    assert result.usage.cost_usd == pytest.approx(150 * 10.0 / 1e6)  # gpt-b's price


def test_both_orchestrators_honour_the_rest(
    cluster: Cluster, server: WireServer, tmp_path: Any
) -> None:
    """Jobs on either orchestrator skip a credential that got 429 on one of them."""
    MODES.clear()
    redis.Redis.from_url(cluster.iso.redis_url).delete(keys.cooldown("anthropic", "a1"))
    MODES["key-a1"] = lambda a: error(429, "rate limited", retry_after="60")
    first = cluster.client.submit("hi", model=CHAIN, workspace=str(tmp_path))
    assert first.wait(timeout=60).status == "completed"
    start = len(server.asked)
    jobs = [cluster.client.submit("hi", model=CHAIN, workspace=str(tmp_path)) for _ in range(12)]
    assert all(j.wait(timeout=60).status == "completed" for j in jobs)
    assert set(server.keys(start)) == {"key-a2"}  # a1 never asked again, by anyone
    with psycopg.connect(cluster.iso.database_url, autocommit=True) as conn:
        ran_on = conn.execute(
            "SELECT DISTINCT orchestrator FROM jobs WHERE id = ANY(%s)",
            ([first.id, *(j.id for j in jobs)],),
        ).fetchall()
    assert len(ran_on) == 2  # both orchestrators ran some of them
