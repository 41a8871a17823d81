"""The pure parts of a job's answer written live in its chat: which channels may have it
(refused at validation where a message cannot be edited), how a long answer is cut into
messages as Telegram counts (UTF-16 code units), and the next request a record needs.
And the writer itself on real Redis against a local server speaking Telegram's Bot API:
one process writes a job's preview at a time. The whole path, with a real orchestrator
and Celery workers, is tests/integration/test_chat_preview.py."""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

import pytest
import redis

from broker import keys
from broker.config.live import ConfigError, validate
from broker.config.settings import Settings
from tests.conftest import Isolated
from tests.sites import Reply, Seen, Site
from workers.tools.messaging.preview import (
    PreviewWriter,
    Record,
    Step,
    first_part,
    next_step,
    parts,
    units,
)

TOKEN = "4242:preview-unit"


@pytest.mark.parametrize(
    "channel",
    [
        {"kind": "email", "host": "mail.example"},
        {"kind": "webhook", "url": "https://hooks.example/x"},
        {"kind": "slack", "url": "https://hooks.slack.com/services/x"},  # no message id
    ],
)
def test_live_answers_are_refused_where_a_message_cannot_be_edited(
    channel: dict[str, str],
) -> None:
    with pytest.raises(ConfigError) as refused:
        validate(Settings(), {"message_channels": {"c": channel | {"live_answers": True}}})
    assert refused.value.field.startswith("message_channels")
    assert "live_answers" in refused.value.message


def test_live_answers_are_taken_by_telegram_and_slack_with_a_token() -> None:
    live = {
        "tg": {"kind": "telegram", "token_env": "TG", "live_answers": True},
        "sl": {"kind": "slack", "token_env": "SL", "live_answers": True, "live_interval_s": 1.2},
    }
    settings = validate(Settings(), {"message_channels": live})
    assert settings.message_channels["sl"].live_interval_s == 1.2


def test_a_long_answer_is_cut_in_parts_that_join_to_it_within_telegrams_count() -> None:
    rng = random.Random(7)
    texts = [
        ("word " * 300 + "\n") * 5,  # cut after a line
        "x" * 9000,  # no place to cut: where it must
        "😀" * 3000,  # two units each: 2048 to a message, not 4096
        "".join(rng.choice("ab 😀\n") for _ in range(20000)),
    ]
    for text in texts:
        cut = parts(text, 4096)
        assert "".join(cut) == text
        assert all(0 < units(p) <= 4096 for p in cut)
    assert [len(p) for p in parts("😀" * 3000, 4096)] == [2048, 952]
    lines = parts(("word " * 300 + "\n") * 5, 4000)
    assert all(p.endswith("\n") for p in lines)  # whole lines: 1,501 characters each
    assert first_part("short", 4096) == "short"


def test_the_next_request_follows_the_record() -> None:
    fresh = Record(version=1, channel="tg", chat="1", text="Hello")
    assert next_step(fresh, 4096) == Step("send", "Hello", -1)
    sent = Record(version=2, text="Hello wor", applied=1, message="700", shown="Hello")
    assert next_step(sent, 4096) == Step("edit", "Hello wor", -1)
    assert next_step(Record(version=2, text="Hello", applied=2, message="700"), 4096) is None
    # an older wake-up finds the newest version applied: nothing to do
    assert next_step(Record(version=3, text="Hi", applied=5, message="700"), 4096) is None
    lost = Record(version=3, text="Hello world", applied=2, message="", lost=True)
    assert next_step(lost, 4096) == Step("skip", "Hello world", -1)
    long = "a " * 3000  # 6,000 characters: two parts of at most 4,096
    final = Record(version=4, text=long, final=True, message="700", shown="Hello")
    first, second = parts(long, 4096)
    assert next_step(final, 4096) == Step("edit", first, 0)
    final.sent = 1
    assert next_step(final, 4096) == Step("send", second, 1)
    final.sent = 2
    assert next_step(final, 4096) is None
    # the preview already shows the first part: only the rest is sent
    shown = Record(version=4, text=long, final=True, message="700", shown=first)
    assert next_step(shown, 4096) == Step("skip", first, 0)
    # no preview message known: every part is a new message
    assert next_step(Record(text=long, final=True, lost=True, message="7"), 4096) == Step(
        "send", first, 0
    )
    assert next_step(Record(text=long, final=True, done=True), 4096) is None


def test_one_process_writes_a_jobs_preview_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two wake-ups at once while Telegram takes a second to answer the first send: the
    second process leaves it to the first (it must not take the send under way for a dead
    one's and give the message up). Then the final edits that message, once, however
    often it is woken."""
    monkeypatch.setenv("TEST_PREVIEW_UNIT_TOKEN", TOKEN)
    calls: list[tuple[str, dict[str, Any]]] = []

    def telegram(seen: Seen) -> Reply:
        method = seen.path.rsplit("/", 1)[1]
        calls.append((method, seen.json()))
        if method == "sendMessage":
            time.sleep(1.0)
        result = {"message_id": 700 + len(calls)}
        return Reply(200, json.dumps({"ok": True, "result": result}).encode(), "application/json")

    routes: dict[str, Any] = {
        f"/bot{TOKEN}/{m}": telegram for m in ("sendMessage", "editMessageText")
    }
    with Site(routes) as site:
        channel = {"kind": "telegram", "token_env": "TEST_PREVIEW_UNIT_TOKEN", "live_answers": True}
        iso = Isolated(
            message_channels={"tg": channel | {"api_base": site.url}},
            web_private_allow=[site.endpoint],
            chat_preview_interval_s=0.2,
        )
        client = redis.Redis.from_url(iso.redis_url)
        try:
            key = keys.chat_preview("j1")
            client.hset(key, mapping={"version": 1, "channel": "tg", "chat": "42", "text": "Hi"})
            resent: list[tuple[str, float]] = []
            writer = PreviewWriter(iso.settings, client, lambda job, at: resent.append((job, at)))
            first = threading.Thread(target=writer.run, args=("j1",))
            first.start()
            time.sleep(0.3)  # the send is under way
            writer.run("j1")
            first.join(10)
            r = Record.read(client, "j1")
            assert r is not None and (r.message, r.applied, r.lost) == ("701", 1, False)
            assert [m for m, _ in calls] == ["sendMessage"]
            client.hset(key, mapping={"version": 2, "text": "Hi there", "final": 1})
            for _ in range(3):
                writer.run("j1")
            assert calls[1:] == [
                ("editMessageText", {"chat_id": "42", "message_id": 701, "text": "Hi there"})
            ]
            assert (Record.read(client, "j1") or Record()).done
            assert client.zscore(keys.CHAT_FINALS_DUE, "j1") is None
        finally:
            client.close()
            iso.drop()


def test_a_provider_that_fails_is_logged_redacted_and_the_final_given_up(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Telegram refuses every request and quotes the request's path (the bot token in
    it): the preview's version is skipped, the final is tried again after a backoff and
    given up after CLAWQ_CHAT_PREVIEW_FINAL_ATTEMPTS; the log never holds the token."""
    monkeypatch.setenv("TEST_PREVIEW_UNIT_TOKEN", TOKEN)
    calls: list[str] = []

    def refusing(seen: Seen) -> Reply:
        calls.append(seen.path.rsplit("/", 1)[1])
        said = {"ok": False, "description": f"Bad Request: chat not found ({seen.path})"}
        return Reply(400, json.dumps(said).encode(), "application/json")

    with Site({f"/bot{TOKEN}/sendMessage": refusing}) as site:
        channel = {"kind": "telegram", "token_env": "TEST_PREVIEW_UNIT_TOKEN", "live_answers": True}
        iso = Isolated(
            message_channels={"tg": channel | {"api_base": site.url}},
            web_private_allow=[site.endpoint],
            chat_preview_interval_s=0.1,
            chat_preview_final_attempts=2,
        )
        client = redis.Redis.from_url(iso.redis_url)
        try:
            key = keys.chat_preview("j2")
            client.hset(key, mapping={"version": 1, "channel": "tg", "chat": "9", "text": "Hi"})
            resent: list[tuple[str, float]] = []
            writer = PreviewWriter(iso.settings, client, lambda job, at: resent.append((job, at)))
            with caplog.at_level("WARNING", logger="clawq.messaging"):
                writer.run("j2")
                r = Record.read(client, "j2")
                assert r is not None and (r.applied, r.message, r.lost) == (1, "", False)
                client.hset(key, mapping={"version": 2, "text": "Hi there", "final": 1})
                client.zadd(keys.CHAT_FINALS_DUE, {"j2": time.time() + 60})
                writer.run("j2")
                assert resent == [("j2", 0.2)]  # backoff: the interval, doubled
                assert not (Record.read(client, "j2") or Record()).done
                writer.run("j2")
            r = Record.read(client, "j2")
            assert r is not None and r.done and r.tries == 2 and r.sent == 0
            assert client.zscore(keys.CHAT_FINALS_DUE, "j2") is None
            assert calls == ["sendMessage"] * 3
            said = caplog.text
            assert "chat not found" in said and "given up after 2" in said
            assert TOKEN not in said and "***" in said
        finally:
            client.close()
            iso.drop()
