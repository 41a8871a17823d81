"""One typed settings object, built at the edge (CLI, client) and passed down.

Nothing reads the environment at import time; every limit is here with the seed's default.
"""

from __future__ import annotations

from pydantic import BaseModel
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from broker.config.providers import ModelContext, ModelStreaming, Providers
from broker.config.sections import (
    AgentLoop,
    Api,
    Artifacts,
    Browser,
    Budgets,
    Cluster,
    Confinement,
    Connections,
    ContextFiles,
    Cron,
    CustomTools,
    Egress,
    Mcp,
    Media,
    Memory,
    Messaging,
    Operations,
    Permissions,
    Processes,
    Replays,
    Sandbox,
    Secrets,
    Subagents,
    ToolCalls,
    Waiting,
    Workers,
)
from broker.config.sources import Environment, config_sources


class Settings(
    BaseSettings,
    Connections,
    AgentLoop,
    Providers,
    ModelStreaming,
    ModelContext,
    ToolCalls,
    Permissions,
    Subagents,
    Mcp,
    Confinement,
    Sandbox,
    Egress,
    Secrets,
    CustomTools,
    Api,
    ContextFiles,
    Memory,
    Artifacts,
    Replays,
    Browser,
    Cron,
    Messaging,
    Media,
    Processes,
    Waiting,
    Budgets,
    Operations,
    Cluster,
    Workers,
):
    """All of clawq's configuration; each field is `CLAWQ_<NAME>` in the environment, or
    `<name>` in a config file (broker/config/sources.py says which, and in what order)."""

    model_config = SettingsConfigDict(env_prefix="CLAWQ_", extra="ignore")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, Environment(settings_cls), *config_sources(settings_cls))


def setting_names() -> list[str]:
    """Every setting's name, section by section in the order `Settings` lists them (the
    model's own field order follows its bases the other way round)."""
    sections = [b for b in Settings.__bases__ if issubclass(b, BaseModel) and b is not BaseSettings]
    return [name for section in sections for name in section.model_fields]
