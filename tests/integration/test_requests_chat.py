"""Answers from chat channels (issue 31), end to end: a job whose origin is a Telegram or
Slack chat has its approval or question sent there with buttons by a real messaging
worker, and the chat's answer comes back through the API's inbound webhook, checked by
the provider's signature. The providers are local servers speaking the documented Bot API
(sendMessage, answerCallbackQuery, editMessageText) and Slack Web API (chat.postMessage,
chat.update, response_url) shapes; the webhooks are sent as Telegram and Slack send them."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from tests.integration.conftest import Cluster, call, script, serve_api, start_cluster, wait_until
from tests.sites import Reply, Seen, Site

TG_TOKEN = "123456:chat-answers"
TG_SECRET = "tg-webhook-secret"
SLACK_SECRET = "slack-signing-secret"


class Provider:
    """Records every call of the bot API and answers as the provider does."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def __call__(self, seen: Seen) -> Reply:
        method = seen.path.rsplit("/", 1)[1]
        with self.lock:
            self.calls.append((method, seen.json()))
            count = len(self.calls)
        result = {"message_id": 700 + count} if method == "sendMessage" else True
        body = {"ok": True, "result": result, "ts": f"1700000000.{count:06d}", "channel": "C1"}
        return Reply(200, json.dumps(body).encode(), "application/json")

    def of(self, method: str) -> list[dict[str, Any]]:
        with self.lock:
            return [body for m, body in self.calls if m == method]


@pytest.fixture(scope="module")
def provider() -> Iterator[tuple[Provider, Site]]:
    seen = Provider()
    routes: dict[str, Any] = {
        f"/bot{TG_TOKEN}/{m}": seen
        for m in ("sendMessage", "answerCallbackQuery", "editMessageText")
    }
    routes |= {f"/slack/{m}": seen for m in ("chat.postMessage", "chat.update", "respond")}
    with Site(routes) as site:
        yield seen, site


@pytest.fixture(scope="module")
def cluster(provider: tuple[Provider, Site]) -> Iterator[Cluster]:
    _, site = provider
    os.environ |= {
        "TEST_CHAT_TG_TOKEN": TG_TOKEN,
        "TEST_CHAT_TG_SECRET": TG_SECRET,
        "TEST_CHAT_SLACK_TOKEN": "xoxb-chat-answers",
        "TEST_CHAT_SLACK_SECRET": SLACK_SECRET,
    }
    channels = {
        "tg": {
            "kind": "telegram",
            "token_env": "TEST_CHAT_TG_TOKEN",
            "secret_env": "TEST_CHAT_TG_SECRET",
            "api_base": site.url,
            "users": {"111": "alice", "222": "bob"},
            "admins": ["999"],
        },
        "sl": {
            "kind": "slack",
            "token_env": "TEST_CHAT_SLACK_TOKEN",
            "secret_env": "TEST_CHAT_SLACK_SECRET",
            "api_base": site.url + "/slack",
            "users": {"UALICE": "alice"},
        },
    }
    yield from start_cluster(
        groups=("fs", "messaging"),
        park_after_s=0.5,
        approval_timeout_s=0,
        message_channels=channels,
        web_private_allow=[site.endpoint],
    )


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Iterator[str]:
    yield from serve_api(cluster)


def from_chat(cluster: Cluster, workspace: Path, channel: str, *turns: dict[str, Any]) -> Any:
    return cluster.client.submit(
        "from the chat",
        workspace=str(workspace),
        ask=["write_file"],
        script=script(*turns),
        user="alice",
        channel=channel,
        chat_id="5001" if channel == "tg" else "C1",
    )


def telegram(api: str, update: dict[str, Any], secret: str = TG_SECRET) -> httpx.Response:
    headers = {"X-Telegram-Bot-Api-Secret-Token": secret}
    return httpx.post(f"{api}/hooks/telegram/tg", json=update, headers=headers, timeout=30)


def pressed(data: str, who: int, name: str) -> dict[str, Any]:
    return {
        "update_id": 1,
        "callback_query": {
            "id": f"cb-{who}-{data}",
            "from": {"id": who, "username": name},
            "message": {"message_id": 1, "chat": {"id": 5001}},
            "data": data,
        },
    }


def test_telegram_buttons_answer_only_for_the_jobs_user_and_a_forged_secret_is_refused(
    cluster: Cluster, api: str, provider: tuple[Provider, Site], workspace: Path
) -> None:
    seen, _ = provider
    write = call("w", "write_file", path="tg.txt", content="from telegram")
    job = from_chat(cluster, workspace, "tg", {"tool_calls": [write]}, {"text": "done"})
    sent = wait_until(
        lambda: [m for m in seen.of("sendMessage") if job.id in m["text"]], 30, "asked in chat"
    )[0]
    assert sent["chat_id"] == "5001" and "write_file needs approval" in sent["text"]
    buttons = [b[0] for b in sent["reply_markup"]["inline_keyboard"]]
    assert [b["text"] for b in buttons] == ["Allow once", "Allow always", "Deny"]
    allow = buttons[0]["callback_data"]

    forged = telegram(api, pressed(allow, 111, "alice"), secret="guessed")
    assert forged.status_code == 401
    refused = telegram(api, pressed(allow, 222, "bob"))  # bob is not the job's user
    assert refused.status_code == 200
    polite = seen.of("answerCallbackQuery")[-1]
    assert polite["show_alert"] is True and "only the job's user" in polite["text"]
    assert cluster.client.store.job_status(job.id) in ("running", "waiting")

    assert telegram(api, pressed(allow, 111, "alice")).status_code == 200
    result = job.wait(timeout=60)
    assert result.status == "completed" and (workspace / "tg.txt").read_text() == "from telegram"
    (edited,) = [e for e in seen.of("editMessageText") if job.id in e["text"]]
    assert edited["message_id"] == 700 + seen.calls.index(("sendMessage", sent)) + 1
    assert "allow-once by telegram:alice" in edited["text"] and "reply_markup" not in edited


def test_a_telegram_reply_answers_a_question(
    cluster: Cluster, api: str, provider: tuple[Provider, Site], workspace: Path
) -> None:
    seen, _ = provider
    asked = call("q", "ask_user", question="Which branch?")
    job = from_chat(cluster, workspace, "tg", {"tool_calls": [asked]}, {"text": "ok"})
    sent = wait_until(
        lambda: [m for m in seen.of("sendMessage") if job.id in m["text"]], 30, "asked in chat"
    )[0]
    assert "Which branch?" in sent["text"] and "reply_markup" not in sent
    message_id = 700 + seen.calls.index(("sendMessage", sent)) + 1
    reply = {
        "update_id": 2,
        "message": {
            "message_id": 9001,
            "from": {"id": 999, "username": "ops"},  # an admin's identity
            "chat": {"id": 5001},
            "text": "release-2.4",
            "reply_to_message": {"message_id": message_id, "chat": {"id": 5001}},
        },
    }
    assert telegram(api, reply).status_code == 200
    result = job.wait(timeout=60)
    assert result.tool_calls[0].output == "telegram:ops answered: release-2.4"


def slack(api: str, payload: dict[str, Any], secret: str = SLACK_SECRET, age_s: int = 0) -> Any:
    body = urlencode({"payload": json.dumps(payload)}).encode()
    stamp = str(int(time.time()) - age_s)
    mac = hmac.new(secret.encode(), b"v0:" + stamp.encode() + b":" + body, hashlib.sha256)
    headers = {
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": "v0=" + mac.hexdigest(),
        "Content-Type": "application/x-www-form-urlencoded",
    }
    return httpx.post(f"{api}/hooks/slack/sl", content=body, headers=headers, timeout=30)


def test_slack_buttons_with_the_signing_secret(
    cluster: Cluster, api: str, provider: tuple[Provider, Site], workspace: Path
) -> None:
    seen, site = provider
    asked = call("q", "ask_user", question="Deploy now?", choices=["yes", "later"])
    job = from_chat(cluster, workspace, "sl", {"tool_calls": [asked]}, {"text": "ok"})
    posted = wait_until(
        lambda: [m for m in seen.of("chat.postMessage") if job.id in m["text"]], 30, "asked"
    )[0]
    assert posted["channel"] == "C1"
    (actions,) = [b for b in posted["blocks"] if b["type"] == "actions"]
    values = [e["value"] for e in actions["elements"]]
    assert [e["text"]["text"] for e in actions["elements"]] == ["yes", "later"]

    def press(user: str, value: str) -> dict[str, Any]:
        return {
            "type": "block_actions",
            "user": {"id": user, "username": user.lower()},
            "actions": [{"action_id": "clawq_0", "value": value}],
            "response_url": f"{site.url}/slack/respond",
        }

    assert slack(api, press("UALICE", values[1]), secret="forged").status_code == 401
    assert slack(api, press("UALICE", values[1]), age_s=600).status_code == 401  # replayed
    assert slack(api, press("UMALLORY", values[1])).status_code == 200
    assert "only the job's user" in seen.of("respond")[-1]["text"]
    assert cluster.client.store.job_status(job.id) in ("running", "waiting")
    assert slack(api, press("UALICE", values[1])).status_code == 200
    result = job.wait(timeout=60)
    assert result.tool_calls[0].output == "slack:ualice answered: later"
    (updated,) = [u for u in seen.of("chat.update") if job.id in u["text"]]
    assert "answered later by slack:ualice" in updated["text"]
