"""Failover against a real local HTTP server speaking both wires and the real Redis: a 429
with retry-after, 529, 500 and a silent server move the chain on, credential by
credential, then model by model; a credential that got 429 rests for every provider
instance on the same Redis (every orchestrator)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from broker import keys
from broker.config.settings import Settings
from orchestrator.conversation import Message
from orchestrator.providers import ModelError, ModelRequest, provider_for
from tests.conftest import Isolated
from tests.orchestrator.model_wire import Answer, Asked, WireServer, error, text

ENV = {"TEST_A1": "key-a1", "TEST_A2": "key-a2", "TEST_O1": "key-o1"}  # the keys' variables
CHAIN = "anthropic:claude-a,openai:gpt-b"


@pytest.fixture(scope="module", autouse=True)
def key_env() -> Iterator[None]:
    os.environ.update(ENV)
    yield
    for name in ENV:
        os.environ.pop(name, None)


@pytest.fixture
def iso() -> Iterator[Isolated]:
    iso = Isolated()
    yield iso
    iso.drop()


def settings(iso: Isolated, server: WireServer, **more: Any) -> Settings:
    creds = [
        {"provider": "anthropic", "label": "a1", "api_key_env": "TEST_A1"},
        {"provider": "anthropic", "label": "a2", "api_key_env": "TEST_A2"},
        {"provider": "openai", "label": "o1", "api_key_env": "TEST_O1"},
    ]
    return iso.settings.model_copy(
        update={
            "anthropic_base_url": server.url,
            "openai_base_url": f"{server.url}/v1",
            "model_credentials": Settings(model_credentials=creds).model_credentials,
            "model_retry_attempts": 2,
            "model_retry_initial_s": 0.05,
            "model_retry_max_s": 0.1,
            "model_timeout_s": 1.0,
            **more,
        }
    )


def ask(s: Settings, model: str = CHAIN, events: list[Any] | None = None) -> Message:
    async def go() -> Message:
        redis = aioredis.Redis.from_url(s.redis_url)
        try:
            async with httpx.AsyncClient(trust_env=False) as http:
                notice = (
                    (lambda kind, **d: events.append((kind, d))) if events is not None else None
                )
                provider = provider_for(model, None, s, http, redis, "main", notice)
                request = ModelRequest(system="", messages=[Message(role="user", text="hi")])
                return await provider.complete(request)
        finally:
            await redis.aclose()

    return asyncio.run(go())


def by_key(**answers: Any) -> Any:
    """An answer per API key: a function of the request, or an Answer."""

    def answer(asked: Asked) -> Answer:
        got = answers[asked.key.replace("-", "_")]
        return got(asked) if callable(got) else got

    return answer


def test_429_with_retry_after_moves_to_the_second_credential_which_rests_the_first(
    iso: Isolated,
) -> None:
    ok = lambda asked: text(asked, "from a2")  # noqa: E731
    with WireServer(by_key(key_a1=error(429, "slow down", retry_after="45"), key_a2=ok)) as srv:
        events: list[Any] = []
        reply = ask(settings(iso, srv), events=events)
        assert (reply.text, reply.model, reply.credential) == ("from a2", CHAIN.split(",")[0], "a2")
        # retry-after (45 s) is over model_retry_after_max_s (30 s): a1 is not tried again
        assert srv.keys() == ["key-a1", "key-a2"]
        assert [(k, d["model"], d["credential"], d["status"]) for k, d in events] == [
            ("model_failover", "anthropic:claude-a", "a1", 429)
        ]
        assert "key-a1" not in str(events)  # labels only, never a key
    left = redis.Redis.from_url(iso.redis_url).pttl(keys.cooldown("anthropic", "a1"))
    assert 43_000 < left <= 45_000  # rests as long as the server asked


def test_a_short_retry_after_is_waited_for_on_the_same_credential(iso: Isolated) -> None:
    seen: list[float] = []

    def a1(asked: Asked) -> Answer:
        seen.append(time.monotonic())
        return error(429, "wait a second", retry_after="1") if len(seen) == 1 else text(asked, "ok")

    with WireServer(by_key(key_a1=a1)) as srv:
        reply = ask(settings(iso, srv))
        assert (reply.text, reply.credential) == ("ok", "a1")
        assert seen[1] - seen[0] >= 1.0  # retry-after honoured, not the 0.05 s backoff


def test_529_and_500_on_every_credential_move_to_the_second_model(iso: Isolated) -> None:
    count = {"a2": 0}

    def a2(asked: Asked) -> Answer:
        count["a2"] += 1
        return error(529 if count["a2"] == 1 else 500, "overloaded")

    with WireServer(
        by_key(key_a1=error(529, "overloaded"), key_a2=a2, key_o1=lambda a: text(a, "from o1"))
    ) as srv:
        events: list[Any] = []
        reply = ask(settings(iso, srv), events=events)
        assert (reply.text, reply.model, reply.credential) == ("from o1", "openai:gpt-b", "o1")
        # two attempts per credential (model_retry_attempts), then the next
        assert srv.keys() == ["key-a1", "key-a1", "key-a2", "key-a2", "key-o1"]
        assert [(d["model"], d["credential"], d["status"]) for _, d in events] == [
            ("anthropic:claude-a", "a1", 529),
            ("anthropic:claude-a", "a2", 500),
        ]
        assert srv.asked[-1].path == "/v1/chat/completions"
        assert srv.asked[-1].body["model"] == "gpt-b"
    # overload is not a rate limit: nothing rests
    assert not redis.Redis.from_url(iso.redis_url).keys("clawq:cooldown:*")


def test_a_server_that_does_not_answer_in_time_moves_on(iso: Isolated) -> None:
    slow = Answer(200, "", delay_s=2.0)  # model_timeout_s is 1 s
    with WireServer(by_key(key_a1=slow, key_a2=lambda a: text(a, "a2 in time"))) as srv:
        events: list[Any] = []
        reply = ask(settings(iso, srv), events=events)
        assert reply.credential == "a2"
        assert "did not answer within 1s" in events[0][1]["error"]


def test_two_providers_on_the_same_redis_share_the_rest(iso: Isolated) -> None:
    """Two provider instances, each with its own Redis connection and HTTP client (as two
    orchestrators have): the second never sends to the credential the first saw 429 on."""
    ok = lambda asked: text(asked, "ok")  # noqa: E731
    with WireServer(by_key(key_a1=error(429, "rate", retry_after="60"), key_a2=ok)) as srv:
        s = settings(iso, srv)
        assert ask(s).credential == "a2"
        first = len(srv.asked)
        for _ in range(3):
            assert ask(s).credential == "a2"
        assert srv.keys(first) == ["key-a2"] * 3


def test_every_credential_resting_fails_clearly_without_a_request(iso: Isolated) -> None:
    with WireServer(by_key(key_a1=error(429, "rate", retry_after="120"))) as srv:
        s = settings(iso, srv, model_cooldown_wait_max_s=0.0)
        s = s.model_copy(update={"model_credentials": s.model_credentials[:1]})  # a1 only
        with pytest.raises(ModelError, match="anthropic returned HTTP 429"):
            ask(s, "anthropic:claude-a")
        with pytest.raises(ModelError, match="resting after a rate limit"):
            ask(s, "anthropic:claude-a")
        assert srv.keys() == ["key-a1"]  # nothing was sent to a resting credential
