"""Model providers: OpenAI-compatible, Anthropic, and the scripted model; a chain of
models with their credentials is tried in order (failover.py)."""

from __future__ import annotations

from typing import Any

import httpx
import redis.asyncio as aioredis

from broker.config.settings import Settings
from orchestrator.providers.base import (
    ContextOverflow,
    ModelError,
    ModelProvider,
    ModelRequest,
    ModelUnavailable,
)
from orchestrator.providers.credentials import Link, parse_chain
from orchestrator.providers.failover import FailoverProvider, Notice
from orchestrator.providers.scripted import ScriptedProvider

__all__ = [
    "ContextOverflow",
    "Link",
    "ModelError",
    "ModelProvider",
    "ModelRequest",
    "ModelUnavailable",
    "parse_chain",
    "provider_for",
]


def provider_for(
    model: str,
    script: dict[str, Any] | None,
    settings: Settings,
    http: httpx.AsyncClient,
    redis: aioredis.Redis | None = None,
    agent_id: str = "main",
    notice: Notice | None = None,
) -> ModelProvider:
    """`scripted`, or a chain of `openai[:model]` and `anthropic[:model]` separated by
    commas, tried in order with the agent's credentials (429s rest them in `redis`)."""
    links = parse_chain(model, settings)
    if links[0].kind == "scripted":
        return ScriptedProvider(script)
    return FailoverProvider(
        links, settings, http, redis, agent_id, notice or (lambda *a, **k: None)
    )
