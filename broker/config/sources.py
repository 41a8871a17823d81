"""Where settings come from, strongest first: what the code passes, the environment
(`CLAWQ_<NAME>`), `./clawq.toml`, `~/.clawq/config.toml` (or only `$CLAWQ_CONFIG` when it is
set), then the defaults. Every command reads the same ones, so a setting written once in a
file holds for `clawq up`, `clawq run` and the processes `up` starts.

A list setting also takes comma-separated values in the environment
(`CLAWQ_WEB_PRIVATE_ALLOW=127.0.0.1:8765,10.0.0.0/8`), besides JSON. A value that cannot be
read is one line naming the setting, the value and the form expected (`SettingsInvalid`)."""

from __future__ import annotations

import difflib
import os
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_origin

from pydantic.fields import FieldInfo
from pydantic_settings import EnvSettingsSource, TomlConfigSettingsSource

from broker.errors import ConfigurationError

if TYPE_CHECKING:
    from pydantic_settings import BaseSettings

PREFIX = "CLAWQ_"
CONFIG_VAR = "CLAWQ_CONFIG"  # a config file to read instead of the usual two
FILE_NAME = "clawq.toml"


class SettingsInvalid(ConfigurationError):
    """A setting whose value cannot be used; the message is one line that says which."""


def home() -> Path:
    """clawq's own folder: its config file, the local stack's data and state."""
    return Path(os.environ.get("CLAWQ_HOME") or Path.home() / ".clawq")


def config_files() -> list[Path]:
    """The config files in force, strongest first: `$CLAWQ_CONFIG` alone when it is set
    (and must exist), else `./clawq.toml` and `~/.clawq/config.toml`, each if present."""
    if chosen := os.environ.get(CONFIG_VAR):
        path = Path(chosen).expanduser()
        if not path.is_file():
            raise SettingsInvalid(f"{CONFIG_VAR}={chosen}: no such file")
        return [path.resolve()]
    found = [Path.cwd() / FILE_NAME, home() / "config.toml"]
    return [p.resolve() for p in found if p.is_file()]


def env_name(field: str) -> str:
    return f"{PREFIX}{field.upper()}"


def is_list(field: FieldInfo) -> bool:
    return get_origin(field.annotation) in (list, set, frozenset)


def expected(field: FieldInfo) -> str:
    """The form of a setting's value, in words, for a refusal."""
    if is_list(field):
        return 'a list: comma-separated values, or JSON such as \'["a", "b"]\''
    return "JSON: an object such as '{\"key\": ...}'"


class Environment(EnvSettingsSource):
    """`CLAWQ_*` variables; a list also as comma-separated values."""

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError:
            if is_list(field) and isinstance(value, str):
                return [part.strip() for part in value.split(",") if part.strip()]
            shown = value if len(str(value)) <= 80 else f"{str(value)[:77]}..."
            raise SettingsInvalid(
                f"{env_name(field_name)}={shown!r}: expected {expected(field)}"
            ) from None


class ConfigFile(TomlConfigSettingsSource):
    """One TOML file of settings, by their names (`web_private_allow = ["127.0.0.1:8765"]`).
    A name that is no setting is refused, as a typo would otherwise be silently ignored."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        self.path = path
        try:
            super().__init__(settings_cls, toml_file=path)
        except tomllib.TOMLDecodeError as exc:
            raise SettingsInvalid(f"{path}: not valid TOML: {exc}") from None
        known = set(settings_cls.model_fields)
        for key in self.toml_data:
            if key not in known:
                near = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean '{near[0]}'?)" if near else ""
                raise SettingsInvalid(f"{path}: '{key}' is not a setting{hint}")


def config_sources(settings_cls: type[BaseSettings]) -> list[ConfigFile]:
    return [ConfigFile(settings_cls, path) for path in config_files()]
