"""Credential scrubbing: secrets go, prose stays."""

from __future__ import annotations

import time

import pytest
import redis

from broker.config.settings import Settings
from broker.protocol import CallContext, CallEnvelope, Group
from tests.conftest import Isolated
from workers.execute import WorkerRuntime
from workers.registry import Registry
from workers.scrub import REDACTED, Scrubber, secrets_of
from workers.tool import SideEffect, Tool, ToolContext, ToolInput, ToolResult

scrub = Scrubber(["hunter2-literal"])


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("key: sk-abcdefghijklmnopqrstuvwx1234", "sk-abcdefghijklmnopqrstuvwx1234"),
        ("ANTHROPIC=sk-ant-api03-abcdefghijklmnopqrstuv", "sk-ant-api03-abcdefghijklmnopqrstuv"),
        ("token ghp_" + "a" * 36, "ghp_" + "a" * 36),
        ("AKIAABCDEFGHIJKLMNOP is the id", "AKIAABCDEFGHIJKLMNOP"),
        ("api_key=abcd1234efgh", "abcd1234efgh"),
        ('"password": "correct-horse-9"', "correct-horse-9"),
        ("DB_PASSWORD=S3cr3tP@ss", "S3cr3tP@ss"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.abc", "eyJhbGciOiJIUzI1NiJ9.e30.abc"),
        ("postgresql://app:pa55word@db:5432/x", "pa55word"),
        ("redis://:topsecret99@cache:6379/0", "topsecret99"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", "MIIEow"),
        ("the value is hunter2-literal.", "hunter2-literal"),
        # round 2: formats from the maintained rule set (detect-secrets) and its supplement
        (
            "SLACK_BOT=" + "xoxb-" + "123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
            "AbCdEfGhIjKlMnOpQrStUvWx",
        ),
        (
            "user token " + "xoxp-" + "1234567890-1234567890-1234567890-abcdef0123456789",
            "abcdef0123456789",
        ),
        ("app " + "xapp-" + "1-A0123456789-1234567890123-0123456789abcdef0123", "0123456789abcdef"),
        (
            "hook https://hooks.slack.com/services/" + "T0123ABCD/B0123ABCD/abcdefABCDEF0123456789",
            "abcdefABCDEF0123456789",
        ),
        ("stripe " + "sk_" + "live_" + "51H0aBcDeFgHiJkLmNoPqRsT", "51H0aBcDeFgHiJkLmNoPqRsT"),
        ("stripe " + "sk_" + "test_" + "4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc"),
        ("restricted " + "rk_" + "live_" + "0123456789abcdefABCDEFGH", "0123456789abcdefABCDEFGH"),
        ("maps key " + "AIza" + "SyA-1234567890abcdefghijklmnopqrstu", "SyA-1234567890abcdef"),
        ("gitlab " + "glpat-" + "xYz0123456789abcdefAB", "xYz0123456789abcdefAB"),
        ("npm " + "npm_" + "abcdefghijklmnopqrstuvwxyz0123456789", "abcdefghijklmnopqrstuvwxyz"),
        (
            "//registry.npmjs.org/:_authToken=" + "01234567-89ab-cdef-0123-456789abcdef",
            "01234567-89ab-cdef-0123-456789abcdef",
        ),
        ("sendgrid " + "SG." + "abcdefghijklmnopqrstuv" + "." + "A" * 43, "A" * 43),
        ("twilio sid " + "AC" + "0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789"),
        ("twilio key " + "SK" + "0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789"),
        (
            "jwt "
            + "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
            + ".eyJzdWIiOiIxMjM0NTY3ODkwIn0"
            + ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0T",
        ),
        ("Authorization: Basic " + "dXNlcjpodW50ZXIyaHVudGVyMg==", "dXNlcjpodW50ZXIyaHVudGVyMg=="),
        ("authorization: token " + "0123456789abcdef0123456789", "0123456789abcdef0123456789"),
        ('{"user": "ann", "password": "correct horse battery"}', "correct horse battery"),
        ('{"client_secret":"s3cr3t-v@lue"}', "s3cr3t-v@lue"),
        ('{"accessToken": "abc.def.ghi.jkl"}', "abc.def.ghi.jkl"),
        ("mongodb+srv://app:Sup3rS3cret@cluster0.mongodb.net/db", "Sup3rS3cret"),
        ("Server=db;Database=x;User Id=app;Password=Pa55w0rd!x;", "Pa55w0rd!x"),
        ("jdbc:mysql://db:3306/x?user=app&password=Pa55w0rd99", "Pa55w0rd99"),
        ("amqp://guest:gu3stpass@rabbit:5672//", "gu3stpass"),
        (
            "bot " + "123456789:" + "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsawQ",
            "AAHdqTcvCH1vGWJxfSeofSAs0K5",
        ),
    ],
)
def test_secrets_are_redacted(text: str, secret: str) -> None:
    out = scrub(text)
    assert secret not in out and REDACTED in out


@pytest.mark.parametrize(
    "text",
    [
        "Set the token to expire after an hour.",
        "The password must be at least 12 characters long.",
        "password: see the vault",
        "our secret sauce is tests",
        "authorization is required for this endpoint",
        "skeleton keys and sk-short",
        "postgresql://localhost:5432/db",
        "Put your Slack bot token in SLACK_BOT_TOKEN, never in the code.",
        "The password must be rotated every 90 days.",
        "Use token-based auth or a password, whichever the server supports.",
        "A JWT is a JSON Web Token; Stripe keys start with sk_live_ or sk_test_.",
        "Authorization: see the docs",
        "basic auth is off; bearer tokens are on",
        "the API key lives in the vault",
        '{"token_type": "bearer", "expires_in": 3600}',
        '{"password": ""}',
        "commit 3f2a9c1d0e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39 fixes the token refresh",
        "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "export PATH=/usr/local/bin:/usr/bin",
    ],
)
def test_prose_is_left_alone(text: str) -> None:
    assert scrub(text) == text


def test_a_narrow_vendor_match_redacts_the_whole_token() -> None:
    token = "xoxb-" + "1234-5678-AbCdEfGhIjKlMnOp"  # the rule set matches only `xoxb-1234-5678`
    assert scrub(f"token={token} end") == f"token={REDACTED} end"
    assert scrub(f"see {token}.") == f"see {REDACTED}."


def test_a_calls_own_literals_extend_the_scrubber() -> None:
    extended = scrub.extended(["per-call-value-42"])
    assert extended("x per-call-value-42 hunter2-literal") == f"x {REDACTED} {REDACTED}"
    assert scrub("per-call-value-42") == "per-call-value-42"


def test_the_processs_own_secrets_are_known() -> None:
    settings = Settings(
        openai_api_key="sk-live-1234567890", database_url="postgresql://u:dbpass123@h/d"
    )
    assert set(secrets_of(settings)) == {"sk-live-1234567890", "dbpass123"}


def test_secrets_named_by_environment_variable_are_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_TG_TOKEN", "123456:telegram-bot-token")
    monkeypatch.setenv("TEST_IMG_KEY", "img-endpoint-key-42")
    monkeypatch.setenv("TEST_MODEL_KEY", "sk-ant-second-credential")
    settings = Settings.model_validate(
        {
            "message_channels": {"tg": {"kind": "telegram", "token_env": "TEST_TG_TOKEN"}},
            "image_endpoints": {"local": {"base_url": "http://x", "api_key_env": "TEST_IMG_KEY"}},
            "elevenlabs_api_key": "eleven-key-123",
            "model_credentials": [
                {"provider": "anthropic", "label": "b", "api_key_env": "TEST_MODEL_KEY"}
            ],
        }
    )
    assert {
        "123456:telegram-bot-token",
        "img-endpoint-key-42",
        "eleven-key-123",
        "sk-ant-second-credential",
    } <= set(secrets_of(settings))


class _LeakInput(ToolInput):
    pass


class Leaky(Tool[_LeakInput]):
    """Puts secrets in both its texts: what the model reads and what the user is shown."""

    name = "leaky"
    description = "Leaks."
    group = Group.fs
    input_model = _LeakInput
    side_effect = SideEffect.read

    def run(self, args: _LeakInput, ctx: ToolContext) -> ToolResult:
        text = (
            "$ curl -H 'Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.abc' "
            "postgresql://app:pa55word@db/x sk-ant-api03-abcdefghijklmnopqrstuv "
            "own-openai-key-0123456789"
        )
        return ToolResult(for_llm=text, for_user=text)


def test_what_the_user_is_shown_is_scrubbed_as_what_the_model_reads(isolated: Isolated) -> None:
    """The worker scrubs for_user too (a command line shown to a person can hold a
    token), with the vendor formats and the process's own secrets; so does the reply it
    pushes and the ledger's copy."""
    settings = isolated.settings.model_copy(update={"openai_api_key": "own-openai-key-0123456789"})
    runtime = WorkerRuntime.start(settings, Registry([Leaky]), "fs", "n")
    try:
        envelope = CallEnvelope(
            call_id="c",
            job_id="j",
            session_id="s",
            tool="leaky",
            input={},
            context=CallContext(workspace="/tmp"),
            timeout_s=5,
            deadline=time.time() + 60,
            reply_to="replies",
        )
        outcome = runtime.run_call(envelope)
        assert outcome is not None
        pushed = redis.Redis.from_url(isolated.redis_url).lrange("replies", 0, -1)
        for text in (outcome.for_user, outcome.for_llm, *(r.decode() for r in pushed)):
            for secret in ("eyJhbGciOiJIUzI1NiJ9", "pa55word", "sk-ant-api03", "own-openai-key"):
                assert secret not in text, (secret, text)
            assert REDACTED in text
        assert outcome.for_user.startswith("$ curl -H 'Authorization: Bearer [REDACTED]")
    finally:
        runtime.stop()
