"""A person's requests in the chat a job came from (issue 31): an approval or a question is
sent there with a button per answer (Telegram's inline keyboard, Slack's block actions),
and once answered the message is edited to say what was decided and by whom.

Sending is a task of the messaging workers (they hold the bots' tokens): the orchestrator
queues it when it opens a request of a job whose origin is a Slack or Telegram channel.
The answers come back to the API's inbound webhooks (orchestrator/api/requests.py), which
edit the message with the same helpers.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from broker.config.settings import Settings
from broker.stores import requests
from broker.stores.requests import PersonRequest, options
from workers.tools.messaging.channels import Channel, Slack, Telegram, channel

log = logging.getLogger("clawq.messaging")

NOTIFY_TASK = "clawq.requests.notify"
LABELS = {"allow-once": "Allow once", "allow-always": "Allow always", "deny": "Deny"}


def text_of(request: PersonRequest) -> str:
    """What the chat is told: the call and why it asks, or the question."""
    if request.kind == "approval":
        given = json.dumps(request.input, ensure_ascii=False)
        cut = given if len(given) <= 600 else given[:600] + "…"
        return f"{request.tool} needs approval: {request.reason}\n{cut}\n(job {request.job_id})"
    question = request.question.question if request.question else request.reason
    if request.question and request.question.choices:
        return f"{question}\n(job {request.job_id})"
    return f"{question}\n(job {request.job_id}; reply to this message to answer)"


def decided(request: PersonRequest, said: str, who: str) -> str:
    return f"{text_of(request)}\n\n✓ {said} by {who}"


def button_data(request: PersonRequest, index: int) -> str:
    return f"{request.id}:{index}"  # Telegram allows 64 bytes: a 32-character id and an index


def notify(settings: Settings, conn: Any, request_id: str, name: str, chat: str) -> None:
    """Send the request to the chat, once (a redelivered task finds it sent)."""
    request = requests.request(conn, request_id)
    if request is None or request.status != "pending" or request.chat_message:
        return
    chan = channel(name, settings)
    labels = [LABELS.get(o, o) for o in options(request)]
    if isinstance(chan, Telegram):
        markup = [
            [{"text": t, "callback_data": button_data(request, i)}] for i, t in enumerate(labels)
        ]
        body: dict[str, Any] = {"chat_id": chat, "text": text_of(request)}
        if markup:
            body["reply_markup"] = {"inline_keyboard": markup}
        sent = chan.call("sendMessage", json=body)
        message_id = str(sent.get("message_id", ""))
    elif isinstance(chan, Slack) and chan.edits:
        blocks: list[dict[str, Any]] = [
            {"type": "section", "text": {"type": "plain_text", "text": text_of(request)}}
        ]
        if labels:
            blocks.append(
                {
                    "type": "actions",
                    "elements": [
                        {
                            "type": "button",
                            "action_id": f"clawq_{i}",
                            "text": {"type": "plain_text", "text": t},
                            "value": button_data(request, i),
                        }
                        for i, t in enumerate(labels)
                    ],
                }
            )
        answer = chan.api(
            "chat.postMessage", {"channel": chat, "text": text_of(request), "blocks": blocks}
        )
        message_id = str(answer.get("ts", ""))
    else:
        log.info("channel %s cannot take answers; request %s not sent there", name, request_id)
        return
    requests.set_chat_message(conn, request_id, name, chat, message_id)


def edit(chan: Channel, request: PersonRequest, text: str) -> None:
    """The request's message now says what was decided (its buttons gone)."""
    where = request.chat_message or {}
    if not where.get("id"):
        return
    if isinstance(chan, Slack):  # the buttons are blocks: the new text replaces them
        section = {"type": "section", "text": {"type": "plain_text", "text": text}}
        chan.api(
            "chat.update",
            {"channel": where["chat"], "ts": where["id"], "text": text, "blocks": [section]},
        )
    else:
        chan.edit(where.get("chat", ""), where["id"], text)
