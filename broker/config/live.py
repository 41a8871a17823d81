"""Live configuration: the reloadable part of the settings as versioned rows in PostgreSQL,
layered over the environment. A version is validated before it is stored; keys an agent
may never change are refused; applying bumps the `config` change counter, and every
orchestrator reloads before its next job (one Redis read per job start, no restart).

Live keys: the tool policy, per-agent and per-user permission rules, hooks, the approval
timeout, the per-session rate limit and the parallel-call cap (orchestrators), and the
web domain lists and message channels (workers, told by a change notice). The managed permission
rules, confinement, secrets and everything else stay with the environment."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psycopg
import redis
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ValidationError

from broker import keys
from broker.config.settings import Settings
from broker.errors import ConfigurationError
from broker.pg.store import Store
from broker.redis import changes

TOPIC = keys.CONFIG_TOPIC
LIVE_KEYS = (
    "tool_policy",
    "agent_permissions",
    "user_permissions",
    "user_ceilings",
    "hooks",
    "approval_timeout_s",
    "approval_on_timeout",
    "agent_approval_timeout_s",
    "rate_limit_per_hour",
    "max_parallel_calls",
    "web_allow_domains",
    "web_block_domains",
    "message_channels",
)
# live keys only people change (`clawq config apply`), never an agent through the gateway
# tool: a channel names the environment variables of its secrets and where they are sent
PEOPLE_ONLY = ("message_channels",)


class ConfigError(ConfigurationError):
    """A configuration that cannot be applied; `field` names what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class ConfigVersion(BaseModel):
    version: int
    config: dict[str, Any]
    status: str
    applied_by: str
    note: str
    created_at: datetime


def validate(base: Settings, config: dict[str, Any]) -> Settings:
    """The settings this configuration makes over `base`, or ConfigError naming the field."""
    if not isinstance(config, dict):
        raise ConfigError("config", "must be an object of setting → value")
    for key in config:
        if key not in LIVE_KEYS:
            raise ConfigError(
                key,
                "is not live configuration (it stays with the environment); live keys: "
                + ", ".join(LIVE_KEYS),
            )
    try:  # by alias: nested models such as hooks read their aliases (PreToolUse) back
        return Settings.model_validate({**base.model_dump(by_alias=True), **config})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "config"
        raise ConfigError(field, first["msg"]) from None


def effective(base: Settings, config: dict[str, Any]) -> Settings:
    """The settings in force: the environment's, with the live keys of `config`."""
    return validate(base, config)


def diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    lines = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old != new:
            lines.append(f"{key}: {json.dumps(old)} → {json.dumps(new)}")
    return lines


class LiveConfigStore:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def current(self) -> ConfigVersion | None:
        row = self.conn.execute(
            "SELECT version, config, status, applied_by, note, created_at FROM config_versions"
            " WHERE status = 'applied' ORDER BY version DESC LIMIT 1"
        ).fetchone()
        return ConfigVersion.model_validate(row) if row else None

    def history(self, limit: int = 20) -> list[ConfigVersion]:
        rows = self.conn.execute(
            "SELECT version, config, status, applied_by, note, created_at FROM config_versions"
            " ORDER BY version DESC LIMIT %s",
            (limit,),
        ).fetchall()
        return [ConfigVersion.model_validate(r) for r in rows]

    def apply(self, base: Settings, config: dict[str, Any], by: str, note: str = "") -> int:
        validate(base, config)
        row = self.conn.execute(
            "INSERT INTO config_versions (config, applied_by, note) VALUES (%s, %s, %s)"
            " RETURNING version",
            (Jsonb(config), by, note),
        ).fetchone()
        assert row is not None
        return int(row["version"])

    def rollback(self, by: str, to: int | None = None) -> int:
        """A new version equal to version `to` (default: the applied one before the
        current); the current one is marked rolled back."""
        current = self.current()
        if current is None:
            raise ConfigError("version", "nothing has been applied; the environment rules")
        if to is None:
            row = self.conn.execute(
                "SELECT config FROM config_versions WHERE status = 'applied' AND version < %s"
                " ORDER BY version DESC LIMIT 1",
                (current.version,),
            ).fetchone()
            target: dict[str, Any] = row["config"] if row else {}
        else:
            row = self.conn.execute(
                "SELECT config FROM config_versions WHERE version = %s", (to,)
            ).fetchone()
            if row is None:
                raise ConfigError("version", f"there is no version {to}; see config.history")
            target = row["config"]
        with self.conn.transaction():
            self.conn.execute(
                "UPDATE config_versions SET status = 'rolled_back' WHERE version = %s",
                (current.version,),
            )
            new = self.conn.execute(
                "INSERT INTO config_versions (config, applied_by, note) VALUES (%s, %s, %s)"
                " RETURNING version",
                (Jsonb(target), by, f"rollback of {current.version}"),
            ).fetchone()
        assert new is not None
        return int(new["version"])

    def mark_bad(self, version: int, why: str) -> bool:
        """True if this call marked it (it was applied): only the first process to find a
        version bad tells the others, so rejections never echo."""
        return (
            self.conn.execute(
                "UPDATE config_versions SET status = 'bad', note = note || %s"
                " WHERE version = %s AND status = 'applied'",
                (f" [failed: {why[:300]}]", version),
            ).rowcount
            == 1
        )


def reject(settings: Settings, version: int, why: str) -> None:
    """Mark `version` bad because a process failed its health check with it, and tell
    every process: the highest applied version, the last good one, is in force again."""
    if version <= 0:  # the environment alone: nothing to roll back to
        return
    store = Store(settings.database_url)
    try:
        marked = LiveConfigStore(store.conn).mark_bad(version, why)
    finally:
        store.close()
    if marked:
        with redis.Redis.from_url(settings.redis_url) as client:
            changes.announce(client, TOPIC)
