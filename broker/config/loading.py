"""Settings as a command loads them: a bad value is one line (`SettingsInvalid`) naming the
setting, where it came from, the value and what was expected; and, for `clawq config show`,
where each effective value came from."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import ValidationError
from pydantic_settings import SettingsError

from broker.config.settings import Settings, setting_names
from broker.config.sources import (
    ConfigFile,
    Environment,
    SettingsInvalid,
    config_files,
    env_name,
)

SECRET = re.compile(r"api_key|secret|password|token")
ENV, DEFAULT = "env", "default"


def load_settings(**given: Any) -> Settings:
    """The settings of this process (the environment and the config files under `given`)."""
    try:
        return Settings(**given)
    except ValidationError as exc:
        raise SettingsInvalid(explain(exc)) from None
    except SettingsError as exc:  # a source's own failure, not a value's
        raise SettingsInvalid(str(exc)) from None


def origins() -> dict[str, str]:
    """Where each setting's value comes from: 'env', a config file's path, or 'default'."""
    found = dict.fromkeys(setting_names(), DEFAULT)
    for source in reversed(config_files()):  # the strongest file is applied last
        for name in ConfigFile(Settings, source).toml_data:
            found[name] = str(source)
    for name in Environment(Settings)():
        found[name] = ENV
    return found


def label(name: str, origin: str) -> str:
    """A setting as its source spells it: CLAWQ_NAME, or name (in FILE)."""
    if origin == ENV:
        return env_name(name)
    if origin == DEFAULT:
        return name
    return f"{name} (in {origin})"


def explain(exc: ValidationError) -> str:
    """The first error of a validation, as one line: setting, source, value, expected."""
    error = exc.errors()[0]
    name = str(error["loc"][0]) if error["loc"] else "settings"
    inner = ".".join(str(part) for part in error["loc"][1:])
    origin = origins().get(name, DEFAULT) if name in Settings.model_fields else DEFAULT
    value = "(hidden)" if SECRET.search(name) else repr(error.get("input"))
    if len(value) > 80:
        value = value[:77] + "..."
    where = f"{label(name, origin)}{'.' + inner if inner else ''}"
    return f"{where}={value}: {error['msg']}"


def masked(name: str, value: Any) -> Any:
    """A setting's value as `config show` prints it: secrets masked, URLs without password."""
    if SECRET.search(name):
        return "(set)" if value else ""
    if isinstance(value, str) and "://" in value and "@" in value:
        parts = urlsplit(value)
        if parts.password:
            netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
            return urlunsplit(parts._replace(netloc=netloc))
    return value


def digests(settings: Settings) -> dict[str, str]:
    """A short digest of each setting's value, to compare two processes' settings without
    writing secrets anywhere (the local stack's state file keeps them)."""
    data = settings.model_dump(mode="json")
    return {
        name: hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]
        for name, value in data.items()
    }
