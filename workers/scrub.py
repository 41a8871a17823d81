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

import _sre
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from re import _casefix, _parser  # type: ignore[attr-defined]
from re import _constants as sre  # type: ignore[attr-defined]
from typing import Any
from urllib.parse import urlsplit

import re2

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


def _whole(text: str, match: re.Match[str]) -> tuple[int, int]:
    return match.span()


def _token(text: str, match: re.Match[str]) -> tuple[int, int]:
    return _widened(text, *_secret_span(match))


def _value(text: str, match: re.Match[str]) -> tuple[int, int]:
    return match.span(1)


def _after_name(text: str, match: re.Match[str]) -> tuple[int, int]:
    return match.span(2)


Span = Callable[[str, re.Match[str]], tuple[int, int]]


@cache
def rules() -> tuple[tuple[re.Pattern[str], Span], ...]:
    """Every fixed pattern, with the part of its match that is the secret."""
    return (
        (PEM, _whole),
        *((p, _token) for p in vendor_patterns()),
        *((p, _value) for p in (HEADER, BEARER, JSON_SECRET)),
        *((p, _after_name) for p in (ASSIGNMENT, URL_PASSWORD)),
    )


class Scrubber:
    """Redacts every secret it finds; built once per process, extended per call."""

    def __init__(self, literals: Iterable[str] = ()) -> None:
        self.literals = tuple(sorted({v for v in literals if v}, key=len, reverse=True))
        self.literal = (
            re.compile("|".join(map(re.escape, self.literals))) if self.literals else None
        )
        self.rules = rules()
        self.prefilter = prefilter()

    def extended(self, literals: Iterable[str]) -> Scrubber:
        """This scrubber plus more literal values (one call's own secrets)."""
        return Scrubber((*self.literals, *literals))

    def spans(self, text: str) -> Iterator[tuple[int, int]]:
        if self.literal:
            yield from (m.span() for m in self.literal.finditer(text))
        for index, matches in self.prefilter.matches(text):
            span = self.rules[index][1]
            yield from (span(text, m) for m in matches)

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


# -- the prefilter: one linear pass over the text says which rules can match, and where ----
#
# Python's engine tried each of the ~40 patterns at every position of the text: 0.4 µs a
# character (120 ms for a 256 KB read_file page), and 25 µs for the shortest result. RE2
# matches them all at once, in time linear in the text, and answers which can match; those
# are tried on Python's engine where RE2 finds their wider form, so the spans are exactly
# what they were. A rule RE2 cannot take is tried everywhere. The translation may only
# widen a pattern, never narrow it: assertions (\b, anchors, lookarounds) are dropped, and
# Python's Unicode classes become Unicode classes at least as wide (RE2's own \d, \s, \w
# are ASCII).

POSITIVE = {  # a class in a match: RE2's form holds every character Python's does
    sre.CATEGORY_DIGIT: r"\p{Nd}",
    sre.CATEGORY_NOT_DIGIT: r"\D",
    sre.CATEGORY_SPACE: r"\s\p{Z}\x0b\x1c-\x1f\x85",
    sre.CATEGORY_NOT_SPACE: r"\S",
    sre.CATEGORY_WORD: r"\p{L}\p{N}_",
    sre.CATEGORY_NOT_WORD: r"\W",
}
NEGATED = {  # inside [^...]: RE2's form holds no character Python's does not
    sre.CATEGORY_DIGIT: r"\d",
    sre.CATEGORY_SPACE: r"\s",
    sre.CATEGORY_WORD: r"\w",
}
RE2_MAX_REPEAT = 1000


class Untranslatable(Exception):
    """A construct RE2 has no superset for: the rule always runs."""


def _char(code: int) -> str:
    char = chr(code)
    return char if char.isascii() and char.isalnum() else f"\\x{{{code:x}}}"


@cache
def _lowered_into() -> dict[int, tuple[int, ...]]:
    """The characters whose lower case (one character, as Python's engine takes it) is
    another, by that other, in the Basic Multilingual Plane, where every case pair of the
    rules' characters lies."""
    into: dict[int, list[int]] = {}
    for code in range(0x10000):
        if (lower := _sre.unicode_tolower(code)) != code:
            into.setdefault(lower, []).append(code)
    return {lower: tuple(codes) for lower, codes in into.items()}


def _same_ignoring_case(code: int) -> list[int]:
    """What Python's engine takes for `code` ignoring case, which RE2's case folding may
    not (U+0130 and U+0131 for i): the characters lowered into its lower case, and the
    engine's extra cases."""
    lower = _sre.unicode_tolower(code)
    return [lower, *_lowered_into().get(lower, ()), *_casefix._EXTRA_CASES.get(lower, ())]


def _class(items: list[tuple[Any, Any]], fold: bool = False) -> str:
    negated = bool(items) and items[0][0] is sre.NEGATE
    forms = NEGATED if negated else POSITIVE
    out = []
    for op, av in items[1:] if negated else items:
        if op is sre.LITERAL:
            out.append(_char(av))
            if fold and not negated:
                out += map(_char, _same_ignoring_case(av))
        elif op is sre.RANGE:
            out.append(f"{_char(av[0])}-{_char(av[1])}")
            if fold and not negated and av[1] - av[0] < 256:
                out += (_char(c) for x in range(av[0], av[1] + 1) for c in _same_ignoring_case(x))
        elif op is sre.CATEGORY and av in forms:
            out.append(forms[av])
        else:
            raise Untranslatable(f"{op} {av} in a class")
    return f"[{'^' if negated else ''}{''.join(out)}]"


def _re2(items: Any, flags: int) -> str:
    """RE2 syntax matching wherever the parsed `items` match (perhaps more)."""
    out = []
    fold = bool(flags & re.IGNORECASE)
    for op, av in items:
        if op is sre.LITERAL:
            form = _class([(op, av)], fold)
        elif op is sre.NOT_LITERAL:
            form = f"[^{_char(av)}]"
        elif op is sre.IN:
            form = _class(av, fold)
        elif op is sre.CATEGORY:
            form = _class([(op, av)])
        elif op is sre.ANY:
            form = r"(?s:.)" if flags & re.DOTALL else r"[^\n]"
        elif op is sre.BRANCH:
            form = "(?:" + "|".join(_re2(branch, flags) for branch in av[1]) + ")"
        elif op is sre.SUBPATTERN:
            _, added, removed, inner = av
            form = "(?:" + _re2(inner, (flags | added) & ~removed) + ")"
        elif op is sre.ATOMIC_GROUP:
            form = "(?:" + _re2(av, flags) + ")"
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            low, high, inner = av
            if low > RE2_MAX_REPEAT:
                raise Untranslatable(f"a repeat of at least {low}")
            top = "" if high == sre.MAXREPEAT or high > RE2_MAX_REPEAT else str(high)
            form = f"(?:{_re2(inner, flags)}){{{low},{top}}}"
        elif op in (sre.AT, sre.ASSERT, sre.ASSERT_NOT):
            continue  # a condition less: a wider match
        elif op is sre.GROUPREF:
            form = r"(?s:.*)"  # whatever the group held
        else:
            raise Untranslatable(str(op))
        if fold and op in (sre.LITERAL, sre.NOT_LITERAL, sre.IN):
            form = f"(?i:{form})"
        out.append(form)
    return "".join(out)


def re2_superset(pattern: re.Pattern[str]) -> str | None:
    """RE2 syntax for a pattern that matches wherever `pattern` does, or None."""
    try:
        parsed = _parser.parse(pattern.pattern, pattern.flags)
        return _re2(parsed, parsed.state.flags)
    except Untranslatable:
        return None


class Prefilter:
    """Which rules can match a text, and where: one pass of RE2 over the text for all the
    rules; then, for each rule it names, the places its wider form matches, the only places
    a match of the rule can start. Python's engine is tried there alone."""

    def __init__(self, patterns: Iterable[re.Pattern[str]]) -> None:
        options = re2.Options()
        options.never_capture = True
        options.max_mem = 64 << 20
        self.set = re2.Set.SearchSet(options)
        self.patterns = list(patterns)
        self.always: list[int] = []  # rules RE2 cannot take, tried everywhere
        self.of_set: list[int] = []
        self.near: dict[int, Any] = {}  # a rule's wider form, where a match never is empty
        for index, pattern in enumerate(self.patterns):
            if (form := re2_superset(pattern)) is None:
                self.always.append(index)
                continue
            self.set.Add(form)
            self.of_set.append(index)
            if _parser.parse(pattern.pattern, pattern.flags).getwidth()[0] > 0:
                self.near[index] = re2.compile(form, options)
        self.set.Compile()

    def matches(self, text: str) -> Iterator[tuple[int, Iterable[re.Match[str]]]]:
        """Each rule that can match `text`, with `finditer`'s matches of it."""
        try:
            data = text.encode()
        except UnicodeEncodeError:  # a lone surrogate: RE2 reads UTF-8 only
            yield from self.everywhere(text)
            return
        found = self.set.Match(data) or ()
        for index in sorted([*self.always, *(self.of_set[i] for i in found)]):
            pattern = self.patterns[index]
            near = self.near.get(index)
            yield index, pattern.finditer(text) if near is None else _where(pattern, near, text)

    def everywhere(self, text: str) -> Iterator[tuple[int, Iterable[re.Match[str]]]]:
        """Every rule, tried at every position of `text`: what the scrubber did before the
        prefilter, and does still with a text RE2 cannot read."""
        return ((i, p.finditer(text)) for i, p in enumerate(self.patterns))


def _where(pattern: re.Pattern[str], near: Any, text: str) -> Iterator[re.Match[str]]:
    """`pattern.finditer(text)`, trying Python's engine only inside the spans where RE2
    matched the pattern's wider form `near`, leftmost first: a match of the pattern starts
    inside one of them (where it starts, the wider form matches too, and the leftmost
    match of the wider form starts there or before and, if it ends before, the next one
    is looked for from its end). `match` at a position sees the text before it, as
    `finditer` does; like it, the next match is looked for from the last one's end."""
    after = 0
    for found in near.finditer(text):
        at = max(found.start(), after)
        while at < found.end():
            if (match := pattern.match(text, at)) is None:
                at += 1
                continue
            yield match
            after = at = match.end()  # never empty: `near` is only kept for such rules


@cache
def prefilter() -> Prefilter:
    return Prefilter(pattern for pattern, _ in rules())


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
