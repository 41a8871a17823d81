"""What an orchestrator installs with a new live configuration."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import redis.asyncio as aioredis

from broker.config.settings import Settings
from orchestrator.live import LiveSettings
from workers.registry import default_registry


def test_whether_commands_run_contained_follows_the_installed_settings() -> None:
    """Worked out once per configuration (not per job), so each new one must redo it: the
    gate allows a command on a worker only because it runs contained."""
    base = Settings(sandbox_enabled=False, exec_confinement="none")
    redis = aioredis.Redis()  # the rate limiter registers its script with it; nothing is sent
    services: Any = SimpleNamespace(registry=default_registry(), redis=redis, contained=False)
    live = LiveSettings(base)
    live._install(services, base.model_copy(update={"sandbox_enabled": True}))
    assert services.contained is True
    live._install(services, base)
    assert services.contained is False
