"""A person's requests answered in the chat a job came from (issue 31): the inbound
webhooks of Telegram (a button's `callback_query`, or a reply to the question's message)
and Slack (interactive message buttons), each checked by the provider's own signature:
Telegram's `X-Telegram-Bot-Api-Secret-Token` (the `secret_token` its setWebhook was given),
Slack's `X-Slack-Signature` (HMAC-SHA256 of `v0:<timestamp>:<body>` with the app's signing
secret, the timestamp within five minutes). Both secrets are the channel's `secret_env`.

Only the job's user (the chat identity mapped to it in the channel's `users`) or an admin
(an identity in its `admins`) may answer; anyone else is told so politely, and the attempt
is logged. The request's message is then edited to say what was decided and by whom.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool

from broker.config.channels import MessageChannel
from broker.config.settings import Settings
from broker.errors import NotFound, Unauthorized
from broker.stores import requests
from broker.stores.requests import PersonRequest, options
from orchestrator.api.deps import Id, Services, Svc
from orchestrator.client import ClientError, LocalClient
from workers.tools.messaging.channels import Telegram, channel
from workers.tools.messaging.requests import decided, edit

log = logging.getLogger("clawq.api")
router = APIRouter(prefix="/hooks", tags=["requests"])
SLACK_SKEW_S = 300  # Slack's own advice: refuse a request older than five minutes


@dataclass
class ChatReply:
    text: str  # what the person is told
    refused: bool = False
    request: PersonRequest | None = None
    edited: str = ""  # the request's message, now with the decision


def chat_channel(svc: Services, name: str, kind: str) -> tuple[Settings, MessageChannel]:
    settings = svc.client().live_settings()
    config = settings.message_channels.get(name)
    if config is None or config.kind != kind:
        raise NotFound(f"no {kind} channel {name}")
    return settings, config


def secret(config: MessageChannel) -> str:
    value = os.environ.get(config.secret_env, "") if config.secret_env else ""
    if not value:
        raise Unauthorized("this channel takes no answers: its secret_env is not set")
    return value


def answer_from_chat(
    client: LocalClient,
    config: MessageChannel,
    request: PersonRequest | None,
    identity: str,
    by: str,
    index: str | None = None,
    text: str | None = None,
) -> ChatReply:
    """Answer `request` for a chat identity, if it may: a button's `index`, or `text`."""
    if request is None:
        return ChatReply("This request is unknown or gone.", refused=True)
    user, admin = config.users.get(identity), identity in config.admins
    if not admin and (user is None or user != request.user_id):
        log.warning(
            "chat answer refused: %s (%s) may not answer request %s of job %s",
            by,
            identity,
            request.id,
            request.job_id,
        )
        return ChatReply("Sorry: only the job's user or an admin may answer this.", refused=True)
    if request.status != "pending":
        return ChatReply(f"Already answered: {request.status}.")
    job = client.job(request.job_id)
    try:
        if index is not None:
            choices = options(request)
            at = int(index) if index.isdigit() else -1
            if not 0 <= at < len(choices):
                return ChatReply("That button is not one of this request's.", refused=True)
            value = choices[at]
            if request.kind == "approval":
                job.approve(request.id, value, by=by, admin=admin)
                said = value
            else:
                multi = request.question is not None and request.question.multi
                job.answer(request.id, [value] if multi else value, by=by)
                said = f"answered {value}"
        else:
            if request.kind != "question":
                return ChatReply("Answer an approval with its buttons.", refused=True)
            job.answer(request.id, text or "", by=by)
            said = f"answered {text}"
    except ClientError as exc:
        return ChatReply(str(exc), refused=True)
    return ChatReply(f"{said}: recorded", request=request, edited=decided(request, said, by))


def telegram_update(svc: Services, name: str, presented: str, update: dict[str, Any]) -> None:
    settings, config = chat_channel(svc, name, "telegram")
    if not hmac.compare_digest(presented.encode(), secret(config).encode()):
        raise Unauthorized("wrong Telegram webhook secret")
    chan = channel(name, settings)
    assert isinstance(chan, Telegram)
    client = svc.client()
    if isinstance(pressed := update.get("callback_query"), dict):
        sender = pressed.get("from") or {}
        identity = str(sender.get("id", ""))
        by = f"telegram:{sender.get('username') or identity}"
        request_id, _, index = str(pressed.get("data", "")).partition(":")
        found = requests.request(client.store.conn, request_id) if request_id else None
        reply = answer_from_chat(client, config, found, identity, by, index=index)
        chan.call(
            "answerCallbackQuery",
            json={
                "callback_query_id": pressed.get("id"),
                "text": reply.text,
                "show_alert": reply.refused,
            },
        )
    elif isinstance(said := update.get("message"), dict) and isinstance(
        to := said.get("reply_to_message"), dict
    ):
        chat = str((said.get("chat") or {}).get("id", ""))
        found = requests.by_chat_message(client.store.conn, name, chat, str(to.get("message_id")))
        if found is None:
            return  # a reply to something else
        sender = said.get("from") or {}
        identity = str(sender.get("id", ""))
        by = f"telegram:{sender.get('username') or identity}"
        reply = answer_from_chat(client, config, found, identity, by, text=said.get("text", ""))
        if reply.refused:
            chan.call(
                "sendMessage",
                json={
                    "chat_id": chat,
                    "text": reply.text,
                    "reply_to_message_id": said.get("message_id"),
                },
            )
    else:
        return
    if reply.request is not None and reply.edited:
        edit(chan, reply.request, reply.edited)


def slack_action(svc: Services, name: str, stamp: str, signature: str, body: bytes) -> None:
    settings, config = chat_channel(svc, name, "slack")
    if not stamp.isdigit() or abs(time.time() - int(stamp)) > SLACK_SKEW_S:
        raise Unauthorized("a missing or stale X-Slack-Request-Timestamp")
    base = b"v0:" + stamp.encode() + b":" + body
    expected = "v0=" + hmac.new(secret(config).encode(), base, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        raise Unauthorized("wrong X-Slack-Signature")
    payload = json.loads((parse_qs(body.decode()).get("payload") or ["{}"])[0])
    actions = payload.get("actions") or [{}]
    sender = payload.get("user") or {}
    identity = str(sender.get("id", ""))
    by = f"slack:{sender.get('username') or identity}"
    request_id, _, index = str(actions[0].get("value", "")).partition(":")
    client = svc.client()
    found = requests.request(client.store.conn, request_id) if request_id else None
    reply = answer_from_chat(client, config, found, identity, by, index=index)
    chan = channel(name, settings)
    if reply.request is not None and reply.edited:
        edit(chan, reply.request, reply.edited)
    elif url := payload.get("response_url"):  # told to this person only
        chan.post(
            url, json={"response_type": "ephemeral", "replace_original": False, "text": reply.text}
        )


@router.post("/telegram/{name}")
async def telegram(name: Id, request: Request, svc: Svc) -> dict[str, bool]:
    """Telegram's webhook for channel `name` (setWebhook with its `secret_token`)."""
    presented = request.headers.get("x-telegram-bot-api-secret-token", "")
    update = await request.json()
    await run_in_threadpool(telegram_update, svc, name, presented, update)
    return {"ok": True}


@router.post("/slack/{name}")
async def slack(name: Id, request: Request, svc: Svc) -> Response:
    """Slack's interactivity request URL for channel `name` (block actions)."""
    body = await request.body()
    stamp = request.headers.get("x-slack-request-timestamp", "")
    signature = request.headers.get("x-slack-signature", "")
    await run_in_threadpool(slack_action, svc, name, stamp, signature, body)
    return Response(status_code=200)
