"""Failover across credentials and models: a chain of models, each with the agent's
credentials for its provider, tried in order until one answers.

A failure another try may not have (`ModelUnavailable`) is retried on the same credential
with exponential backoff and jitter (tenacity), waiting at least what `retry-after` asks;
when its attempts run out, or the server asks for a wait longer than
`model_retry_after_max_s`, the next credential is tried, then the next model. A credential
that got 429 rests cluster-wide (a Redis key with a TTL: `broker/redis/cooldown.py`), so
no orchestrator sends it anything until it expires. A reply that broke off after it had
handed over a tool call is not asked again elsewhere (the call may be running): it fails.
A reply asked again after some of its text was streamed first resets the deltas
(`model_delta` with `reset`), so a client discards what it showed instead of doubling it.

Each move is said (`model_failover`: which model and credential, by label, and why); the
reply says who answered (`Message.model`, `Message.credential`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import httpx
import redis.asyncio as aioredis
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from broker.config.settings import Settings
from broker.redis import cooldown
from orchestrator.conversation import Message, ToolCall
from orchestrator.providers.anthropic import AnthropicProvider
from orchestrator.providers.base import (
    Deltas,
    ModelError,
    ModelProvider,
    ModelRequest,
    ModelUnavailable,
    OnToolCall,
)
from orchestrator.providers.credentials import Credential, Link, credentials
from orchestrator.providers.openai import OpenAIProvider

log = logging.getLogger("clawq.models")

Notice = Callable[..., None]  # notice("model_failover", **data): an event of the job
ERROR_CHARS = 300  # of a failure, in an event


def _quiet(*_: Any, **__: Any) -> None:
    pass


class Given:
    """The deltas of one reply as failover passes them on: reset before a new try when the
    last one gave some text."""

    def __init__(self, deltas: Deltas | None) -> None:
        self.deltas = deltas
        self.gave = False

    def text(self, chunk: str) -> None:
        if self.deltas is not None:
            self.gave = True
            self.deltas.text(chunk)

    def reset(self) -> None:
        if self.gave and self.deltas is not None:
            self.deltas.reset()
        self.gave = False


class FailoverProvider:
    def __init__(
        self,
        links: list[Link],
        settings: Settings,
        http: httpx.AsyncClient,
        redis: aioredis.Redis | None = None,
        agent_id: str = "main",
        notice: Notice = _quiet,
    ) -> None:
        self.links = links
        self.settings = settings
        self.http = http
        self.redis = redis
        self.agent_id = agent_id
        self.notice = notice

    def routes(self) -> list[tuple[Link, Credential]]:
        return [
            (link, cred)
            for link in self.links
            for cred in credentials(self.settings, link.kind, self.agent_id)
        ]

    def provider(self, link: Link, cred: Credential) -> ModelProvider:
        kind = OpenAIProvider if link.kind == "openai" else AnthropicProvider
        return kind(self.settings, self.http, link.model, cred)

    async def complete(
        self,
        request: ModelRequest,
        on_tool_call: OnToolCall | None = None,
        deltas: Deltas | None = None,
    ) -> Message:
        handed: list[ToolCall] = []
        given = Given(deltas)

        async def hand(call: ToolCall) -> None:
            handed.append(call)
            if on_tool_call is not None:
                await on_tool_call(call)

        routes, errors, waited = self.routes(), list[tuple[str, str]](), 0.0
        while True:
            resting = await self._resting(routes)
            tried = False
            for link, cred in routes:
                if cred.key in resting:
                    continue
                tried = True
                try:
                    reply = await self._attempts(link, cred, request, hand, handed, given)
                except ModelUnavailable as exc:
                    if handed:  # a call is on its way: asking elsewhere could run it twice
                        raise ModelError(str(exc)) from exc
                    errors.append((f"{link.name} ({cred.label}): ", str(exc)))
                    await self._moved_on(link, cred, exc)
                    continue
                reply.model, reply.credential = link.name, cred.label
                return reply
            if tried or not resting:
                break
            soonest = min(resting.values())  # every credential rests: wait for the first
            if waited + soonest > self.settings.model_cooldown_wait_max_s:
                errors.append(
                    (
                        "",
                        f"every credential is resting after a rate limit (429); the first is "
                        f"free again in {soonest:.0f}s",
                    )
                )
                break
            await asyncio.sleep(soonest)
            waited += soonest
        if len(errors) == 1:  # one model, one credential: its own words
            raise ModelError(errors[0][1])
        raise ModelError("no model of the chain answered: " + "; ".join(a + b for a, b in errors))

    async def _resting(self, routes: list[tuple[Link, Credential]]) -> dict[str, float]:
        if self.redis is None:
            return {}
        pairs = list(dict.fromkeys((c.provider, c.label) for _, c in routes))
        return await cooldown.resting(self.redis, pairs)

    async def _moved_on(self, link: Link, cred: Credential, exc: ModelUnavailable) -> None:
        """Rest a credential that got 429, and say the chain moves on."""
        rest = 0.0
        if exc.status == 429:
            rest = exc.retry_after or self.settings.model_cooldown_s
            if self.redis is not None:
                await cooldown.rest(self.redis, cred.provider, cred.label, rest)
        log.warning("%s (%s) failed, moving on: %s", link.name, cred.label, exc)
        self.notice(
            "model_failover",
            model=link.name,
            credential=cred.label,
            status=exc.status,
            error=str(exc)[:ERROR_CHARS],
            rests_s=rest,
        )

    async def _attempts(
        self,
        link: Link,
        cred: Credential,
        request: ModelRequest,
        hand: OnToolCall,
        handed: list[ToolCall],
        given: Given,
    ) -> Message:
        """One credential: tried again while the failure may pass, as tenacity waits."""
        s = self.settings
        if cred.missing:
            raise ModelUnavailable(f"its key's environment variable {cred.missing} is not set")
        provider = self.provider(link, cred)
        backoff = wait_exponential_jitter(
            multiplier=s.model_retry_initial_s,
            max=s.model_retry_max_s,
            jitter=s.model_retry_initial_s,
        )

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            asked = getattr(exc, "retry_after", None) or 0.0
            return max(asked, backoff(state))

        def again(exc: BaseException) -> bool:
            return (
                isinstance(exc, ModelUnavailable)
                and not handed
                and (exc.retry_after or 0.0) <= s.model_retry_after_max_s
            )

        reply = None
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(again),
            stop=stop_after_attempt(s.model_retry_attempts),
            wait=wait,
            reraise=True,
        ):
            with attempt:
                given.reset()  # a try after one that gave text: the client drops it
                reply = await provider.complete(request, hand, given)
        assert reply is not None
        return reply
