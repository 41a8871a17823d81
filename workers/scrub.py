"""Credential scrubbing (goclaw §8): secrets never leave a worker in a tool result.

The seed's patterns, plus `Authorization: Bearer` headers, PEM private keys, passwords in
connection strings, and the literal values of secrets this process holds. Assignments
must look like `name: value` or `name=value` with a secret-like value, so ordinary prose
that merely mentions a password or a token is left alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from broker.settings import Settings

REDACTED = "[REDACTED]"
PATTERNS = [
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
    re.compile(r"sk-ant-[A-Za-z0-9_-]{20,}"),
    re.compile(r"sk-[A-Za-z0-9_-]{20,}"),
    re.compile(r"gh[pousr]_[A-Za-z0-9]{36,}"),
    re.compile(r"github_pat_[A-Za-z0-9_]{40,}"),
    re.compile(r"AKIA[A-Z0-9]{16}"),
    re.compile(r"(?i)(?<=authorization: bearer )[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"(?i)(?<=bearer )[A-Za-z0-9._~+/=-]{20,}"),
]
# name[:=]value: the value alone is replaced, the name stays readable
ASSIGNMENT = re.compile(
    r"(?i)\b((?:[a-z0-9_.-]*_)?(?:api[_-]?key|token|secret|password|passwd|bearer|authorization)"
    r"[\"']?\s*[:=]\s*[\"']?)([A-Za-z0-9._~+/=@!$%^&*-]{8,})"
)
URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/@]*:)([^\s@/]+)(@)")


def secrets_of(settings: Settings) -> list[str]:
    """Literal secret values this process holds: API keys and passwords in service URLs."""
    found = [settings.openai_api_key, settings.anthropic_api_key]
    for url in (settings.redis_url, settings.database_url):
        found.append(urlsplit(url).password or "")
    return [s for s in found if len(s) >= 6]


class Scrubber:
    def __init__(self, literals: Iterable[str] = ()) -> None:
        values = sorted({v for v in literals if v}, key=len, reverse=True)
        self.literal = re.compile("|".join(map(re.escape, values))) if values else None

    def __call__(self, text: str) -> str:
        if not text:
            return text
        if self.literal:
            text = self.literal.sub(REDACTED, text)
        for pattern in PATTERNS:
            text = pattern.sub(REDACTED, text)
        text = URL_PASSWORD.sub(rf"\1{REDACTED}\3", text)
        return ASSIGNMENT.sub(
            lambda m: m.group(1) + REDACTED if m.group(2) != REDACTED else m.group(0), text
        )
