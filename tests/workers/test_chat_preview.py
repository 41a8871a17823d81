"""The pure parts of a job's answer written live in its chat: which channels may have it
(refused at validation where a message cannot be edited), how a long answer is cut into
messages as Telegram counts (UTF-16 code units), and the next request a record needs.
The whole path, with real workers and providers, is tests/integration/test_chat_preview.py."""

from __future__ import annotations

import random

import pytest

from broker.config.live import ConfigError, validate
from broker.config.settings import Settings
from workers.tools.messaging.preview import Record, Step, first_part, next_step, parts, units


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
