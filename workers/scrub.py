"""Credential scrubbing (goclaw §8): secrets never leave a worker in a tool result.

Vendor formats come from a maintained rule set, the regex plugins of detect-secrets
(Slack, Stripe, GitLab, npm, SendGrid, Twilio, JWTs, GitHub, AWS, PyPI, Discord,
Telegram, …). The few formats it lacks are added here (Slack app tokens, Stripe test and
restricted keys, Google API keys, bare npm tokens, OpenAI and Anthropic keys), with the
structural ones: PEM private keys, `Authorization` headers, JSON and `name=value`
assignments of secret-named keys, passwords in connection strings, and the literal
values of secrets this process holds. A vendor match is widened to the whole token it
sits in, so no tail of a secret survives a narrow pattern. Assignments need a
secret-like value, so prose that mentions a password or a token stays as it is.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from typing import Any
from urllib.parse import urlsplit

from broker.config.settings import Settings

REDACTED = "[REDACTED]"
TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.+/~")

# formats the maintained rule set does not know (or knows too narrowly)
SUPPLEMENT = [
    re.compile(r"sk-ant-[A-Za-z0-9_-]{20,}"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{40,}"),
    re.compile(r"\bxapp-\d-[A-Za-z0-9-]{10,}"),  # Slack app-level tokens
    re.compile(r"\bxox[a-z]-[A-Za-z0-9-]{10,}"),  # Slack tokens with upper-case parts
    re.compile(r"\b[rs]k_(?:test|live|prod)_[0-9A-Za-z]{10,}"),  # Stripe
    re.compile(r"\bAIza[0-9A-Za-z_-]{35}"),  # Google API keys
    re.compile(r"\bnpm_[A-Za-z0-9]{36}"),
    re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"),
    re.compile(r"\bSK[0-9a-fA-F]{32}\b"),  # Twilio API keys
]
# the value alone is redacted (group 1 or 2); the name stays readable
PEM = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S)
HEADER = re.compile(
    r"(?i)\b(?:proxy-)?authorization\s*:\s*(?:basic|bearer|token|digest|negotiate)\s+"
    r"([A-Za-z0-9._~+/=-]{8,})"
)
BEARER = re.compile(r"(?i)\bbearer\s+([A-Za-z0-9._~+/=-]{20,})")
SECRET_WORDS = (
    r"(?:api[_-]?key|apikey|token|secret|password|passwd|bearer|authorization|"
    r"access[_-]?key|private[_-]?key|client[_-]?secret|credentials?)"
)
JSON_SECRET = re.compile(rf'(?i)"[\w.-]*{SECRET_WORDS}"\s*:\s*"((?:[^"\\\n]|\\.){{4,}})"')
ASSIGNMENT = re.compile(
    r"(?i)\b((?:[a-z0-9_.-]*_)?(?:api[_-]?key|token|secret|password|passwd|bearer|authorization)"
    r"[\"']?\s*[:=]\s*[\"']?)([A-Za-z0-9._~+/=@!$%^&*-]{8,})"
)
URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/@]*:)([^\s@/]+)(@)")

MAINTAINED_PLUGINS = (
    "aws.AWSKeyDetector",
    "azure_storage_key.AzureStorageKeyDetector",
    "basic_auth.BasicAuthDetector",
    "discord.DiscordBotTokenDetector",
    "github_token.GitHubTokenDetector",
    "gitlab_token.GitLabTokenDetector",
    "jwt.JwtTokenDetector",
    "mailchimp.MailchimpDetector",
    "npm.NpmDetector",
    "openai.OpenAIDetector",
    "pypi_token.PypiTokenDetector",
    "sendgrid.SendGridDetector",
    "slack.SlackDetector",
    "square_oauth.SquareOAuthDetector",
    "stripe.StripeDetector",
    "telegram_token.TelegramBotTokenDetector",
    "twilio.TwilioKeyDetector",
)


@cache
def vendor_patterns() -> tuple[re.Pattern[str], ...]:
    """detect-secrets' regexes for the plugins above, then the supplement."""
    import importlib

    found: list[re.Pattern[str]] = []
    for dotted in MAINTAINED_PLUGINS:
        module, name = dotted.rsplit(".", 1)
        plugin = getattr(importlib.import_module(f"detect_secrets.plugins.{module}"), name)
        found += [re.compile(p.pattern, p.flags) for p in plugin().denylist]
    return (*found, *SUPPLEMENT)


def secrets_of(settings: Settings) -> list[str]:
    """Literal secret values this process holds: API keys and passwords in service URLs."""
    found = [
        settings.openai_api_key,
        settings.anthropic_api_key,
        settings.brave_api_key,
        settings.tavily_api_key,
        settings.elevenlabs_api_key,
        settings.secret_key,
        *settings.secret_keys_retired.values(),
    ]
    # secrets that configuration names by environment variable (channels, image endpoints)
    named = [
        name
        for c in settings.message_channels.values()
        for name in (c.token_env, c.secret_env, c.password_env)
    ] + [e.api_key_env for e in settings.image_endpoints.values()]
    named += [c.api_key_env for c in settings.model_credentials]  # failover's keys
    found += [os.environ.get(name, "") for name in named if name]
    for url in (settings.redis_url, settings.database_url):
        found.append(urlsplit(url).password or "")
    return [s for s in found if len(s) >= 6]


def _secret_span(match: re.Match[str]) -> tuple[int, int]:
    """The span of the secret in a match: its first non-empty group, else all of it."""
    for index in range(1, (match.re.groups or 0) + 1):
        if match.group(index):
            return match.span(index)
    return match.span()


def _widened(text: str, start: int, end: int) -> tuple[int, int]:
    """The whole token around a match: `=` only as trailing padding, a final `.` is prose."""
    while start > 0 and text[start - 1] in TOKEN_CHARS:
        start -= 1
    while end < len(text) and (text[end] in TOKEN_CHARS or text[end] == "="):
        end += 1
    while end > start and text[end - 1] == ".":
        end -= 1
    return start, end


class Scrubber:
    """Redacts every secret it finds; built once per process, extended per call."""

    def __init__(self, literals: Iterable[str] = ()) -> None:
        self.literals = tuple(sorted({v for v in literals if v}, key=len, reverse=True))
        self.literal = (
            re.compile("|".join(map(re.escape, self.literals))) if self.literals else None
        )
        self.vendor = vendor_patterns()

    def extended(self, literals: Iterable[str]) -> Scrubber:
        """This scrubber plus more literal values (one call's own secrets)."""
        return Scrubber((*self.literals, *literals))

    def spans(self, text: str) -> Iterator[tuple[int, int]]:
        if self.literal:
            yield from (m.span() for m in self.literal.finditer(text))
        yield from (m.span() for m in PEM.finditer(text))
        for pattern in self.vendor:
            for m in pattern.finditer(text):
                yield _widened(text, *_secret_span(m))
        for pattern in (HEADER, BEARER, JSON_SECRET):
            yield from (m.span(1) for m in pattern.finditer(text))
        for pattern in (ASSIGNMENT, URL_PASSWORD):
            yield from (m.span(2) for m in pattern.finditer(text))

    def values(self, value: Any) -> Any:
        """Every string inside `value` (a result's metadata: lists, dicts) scrubbed."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            return {k: self.values(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.values(v) for v in value]
        return value

    def __call__(self, text: str) -> str:
        if not text:
            return text
        merged: list[list[int]] = []
        for start, end in sorted(self.spans(text)):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            elif end > start:
                merged.append([start, end])
        if not merged:
            return text
        out, at = [], 0
        for start, end in merged:
            out += [text[at:start], REDACTED]
            at = end
        out.append(text[at:])
        return "".join(out)


_log_scrubber: list[Callable[[], Scrubber]] = []


def scrub_logs(current: Callable[[], Scrubber]) -> None:
    """Scrub every log record this process makes with `current()` (the scrubber in force
    at the time), its traceback included: a library's log line (httpx names the URL it
    requested, a bot token in its path) must not carry a secret into the worker's log.
    A record factory, so every logger and handler is covered, whoever configured them."""
    if _log_scrubber:
        _log_scrubber[0] = current
        return
    _log_scrubber.append(current)
    made = logging.getLogRecordFactory()

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = made(*args, **kwargs)
        scrub = _log_scrubber[0]()
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: logging reports it itself
            return record
        clean = scrub(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = scrub(logging.Formatter().formatException(record.exc_info))
        return record

    logging.setLogRecordFactory(factory)
