"""Model providers: OpenAI-compatible, Anthropic, and the scripted model."""

from __future__ import annotations

from typing import Any

import httpx

from broker.config.settings import Settings
from orchestrator.providers.anthropic import AnthropicProvider
from orchestrator.providers.base import ModelError, ModelProvider, ModelRequest
from orchestrator.providers.openai import OpenAIProvider
from orchestrator.providers.scripted import ScriptedProvider

__all__ = ["ModelError", "ModelProvider", "ModelRequest", "provider_for"]


def provider_for(
    model: str, script: dict[str, Any] | None, settings: Settings, http: httpx.AsyncClient
) -> ModelProvider:
    """`scripted`, `openai[:model]` or `anthropic[:model]`."""
    kind, _, name = model.partition(":")
    if kind == "scripted":
        return ScriptedProvider(script)
    if kind == "openai":
        return OpenAIProvider(settings, http, name or settings.openai_model)
    if kind == "anthropic":
        return AnthropicProvider(settings, http, name or settings.anthropic_model)
    raise ModelError(f"unknown model '{model}': use scripted, openai[:name] or anthropic[:name]")
