"""A job's model chain (`anthropic:m1,openai:m2`) and the credentials of each provider
for an agent: those `model_credentials` lists for it, in order, else the provider's own
`<provider>_api_key` (labelled `default`). Keys are read from the environment, and only
labels ever leave this module (events, errors, logs)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from broker.config.settings import Settings
from orchestrator.providers.base import ModelError

KINDS = ("scripted", "openai", "anthropic")


@dataclass(frozen=True)
class Link:
    """One model of a chain."""

    kind: str
    model: str

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.model}" if self.model else self.kind


@dataclass(frozen=True)
class Credential:
    provider: str
    label: str
    base_url: str
    api_key: str = field(repr=False)
    missing: str = ""  # the environment variable that should hold its key, when unset

    @property
    def key(self) -> str:
        return f"{self.provider}:{self.label}"


def parse_chain(model: str, settings: Settings | None = None) -> list[Link]:
    """The models of `model`, in order; with `settings`, a bare provider gets its default
    model. `scripted` stands alone."""
    parts = [p.strip() for p in model.split(",")]
    if not model.strip() or not all(parts):
        raise ModelError(f"invalid model '{model}': give models separated by commas")
    links = []
    for part in parts:
        kind, _, name = part.partition(":")
        if kind not in KINDS:
            raise ModelError(
                f"unknown model '{part}': use scripted, openai[:name] or anthropic[:name], "
                "or a chain of them separated by commas"
            )
        if kind == "scripted" and len(parts) > 1:
            raise ModelError("the scripted model cannot be part of a chain")
        if settings is not None and not name:
            name = {"openai": settings.openai_model, "anthropic": settings.anthropic_model}.get(
                kind, ""
            )
        links.append(Link(kind, name))
    return links


def credentials(settings: Settings, provider: str, agent_id: str) -> list[Credential]:
    base = settings.openai_base_url if provider == "openai" else settings.anthropic_base_url
    listed = [
        c
        for c in settings.model_credentials
        if c.provider == provider and (not c.agents or agent_id in c.agents)
    ]
    if not listed:
        key = settings.openai_api_key if provider == "openai" else settings.anthropic_api_key
        return [Credential(provider, "default", base, key)]
    return [
        Credential(
            provider,
            c.label,
            c.base_url or base,
            os.environ.get(c.api_key_env, ""),
            "" if os.environ.get(c.api_key_env) else c.api_key_env,
        )
        for c in listed
    ]
