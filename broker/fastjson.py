"""JSON encoding on the hot path: orjson (several times faster than `json`), falling back
to `json` for what orjson refuses (integers beyond 64 bits), so the output never differs
in meaning. Compact, like `json.dumps(..., separators=(",", ":"))`."""

from __future__ import annotations

import json
from typing import Any

import orjson

_OPTIONS = orjson.OPT_NON_STR_KEYS


def dumps_bytes(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj, option=_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError: a big integer, or a type json may know
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def dumps(obj: Any) -> str:
    return dumps_bytes(obj).decode()
