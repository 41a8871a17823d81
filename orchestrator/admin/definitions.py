"""A definition (MCP servers, a custom tool) as people give it: a dict, a JSON text or the
path of a JSON file; the direct admin and the remote client read it alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from broker.errors import Invalid


def read_definition(config: dict[str, Any] | str | Path) -> dict[str, Any]:
    if isinstance(config, Path) or (
        isinstance(config, str) and not config.lstrip().startswith("{")
    ):
        try:
            config = Path(config).read_text()
        except OSError as exc:
            raise Invalid(f"cannot read {config}: {exc.strerror}") from None
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError as exc:
            raise Invalid(f"not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise Invalid("a definition is a JSON object")
    return config
