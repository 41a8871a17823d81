"""Credential scrubbing: secrets go, prose stays."""

from __future__ import annotations

import pytest

from broker.settings import Settings
from workers.scrub import REDACTED, Scrubber, secrets_of

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
    ],
)
def test_prose_is_left_alone(text: str) -> None:
    assert scrub(text) == text


def test_the_processs_own_secrets_are_known() -> None:
    settings = Settings(
        openai_api_key="sk-live-1234567890", database_url="postgresql://u:dbpass123@h/d"
    )
    assert set(secrets_of(settings)) == {"sk-live-1234567890", "dbpass123"}
