"""The four channel kinds, each speaking its provider's documented API: a signed JSON
webhook, Slack (an incoming webhook, or chat.postMessage / chat.update with a bot token),
Telegram's Bot API (sendMessage, sendDocument, editMessageText) and email (SMTP with
STARTTLS). HTTP goes through the egress client; SMTP connects only to an address the
egress policy allows. Secrets are read from the environment variable the channel names
and never appear in what is returned or raised."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import smtplib
import socket
import ssl
import time
import uuid
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import make_msgid
from typing import Any
from urllib.parse import quote

from broker.config.channels import MessageChannel
from broker.config.settings import Settings
from broker.errors import RunError
from workers.egress.client import checked_addresses, egress_for
from workers.egress.netguard import EgressError, EgressPolicy

SIGNATURE_HEADER = "X-Clawq-Signature"  # sha256=<hex HMAC of "<timestamp>.<body>">
TIMESTAMP_HEADER = "X-Clawq-Timestamp"
DELIVERY_HEADER = "X-Clawq-Delivery"  # the same for every attempt of one call
NOT_SENT = ("connect timeout", "pool timeout", "connection refused", "has no address")


@dataclass
class Attachment:
    name: str
    mime: str
    data: bytes
    sha256: str


@dataclass
class Outgoing:
    """One message as the tool asks for it."""

    target: str
    text: str
    delivery_id: str  # stable across deliveries of the call (uuid5 of its outbox key)
    subject: str = ""
    attachments: list[Attachment] = field(default_factory=list)


class ChannelError(RunError):
    """The provider did not take the message. `sent_maybe`: the request may have reached
    it (a read timeout, a dropped connection), so it must not be sent again."""

    def __init__(self, message: str, sent_maybe: bool = False) -> None:
        super().__init__(message)
        self.sent_maybe = sent_maybe


def delivery_id(key: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, "clawq-message:" + key).hex


class Channel:
    """A configured channel; `send` and `edit` return the provider's message id."""

    def __init__(self, name: str, config: MessageChannel, settings: Settings) -> None:
        self.name = name
        self.config = config
        self.settings = settings
        self.secrets: list[str] = []

    @property
    def edits(self) -> bool:
        """Whether a sent message can be edited here (asked before anything is looked up)."""
        return True

    def secret(self, env: str, what: str) -> str:
        value = os.environ.get(env, "") if env else ""
        if not value:
            raise ChannelError(
                f"channel {self.name}: its {what} variable {env or '(none)'} is unset"
            )
        self.secrets.append(value)
        return value

    def redact(self, text: str) -> str:
        """`text` without this channel's secrets, as they are and as a URL carries them
        (a provider's error often quotes the request path, a bot token in it)."""
        for value in self.secrets:
            for form in {value, quote(value), quote(value, safe="")}:
                text = text.replace(form, "***")
        return text

    def fail(self, what: str, sent_maybe: bool = False) -> ChannelError:
        """The error for `what` a provider said, redacted: it may echo what it was sent."""
        return ChannelError(self.redact(f"{self.name}: {what}"), sent_maybe)

    def send(self, message: Outgoing) -> str:
        raise NotImplementedError

    def edit(self, target: str, message_id: str, text: str) -> str:
        raise ChannelError(f"channel {self.name} ({self.config.kind}) cannot edit a message")

    # -- HTTP ----------------------------------------------------------------------------

    def post(self, url: str, **kwargs: Any) -> tuple[int, Any]:
        """POST through the egress client: (status, JSON body or text)."""
        try:
            got = egress_for(self.settings).request("POST", url, **kwargs)
        except EgressError as exc:
            sent_maybe = exc.code != "url_not_allowed" and not any(
                marker in exc.reason.lower() for marker in NOT_SENT
            )
            raise self.fail(exc.reason, sent_maybe) from None
        text = got.body.decode(errors="replace")
        try:
            return got.status, json.loads(text) if text.strip() else {}
        except ValueError:
            return got.status, text


class Webhook(Channel):
    """A JSON POST signed like Stripe's and GitHub's webhooks: the HMAC-SHA256 of
    "<timestamp>.<body>" with the channel's secret, in X-Clawq-Signature; the delivery id
    in X-Clawq-Delivery lets a receiver drop a duplicate. Edits are posted as events."""

    def _post(self, payload: dict[str, Any], delivery: str) -> str:
        body = json.dumps(payload, separators=(",", ":")).encode()
        stamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            TIMESTAMP_HEADER: stamp,
            DELIVERY_HEADER: delivery,
        }
        if self.config.secret_env:
            key = self.secret(self.config.secret_env, "secret").encode()
            digest = hmac.new(key, stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
            headers[SIGNATURE_HEADER] = "sha256=" + digest
        status, answer = self.post(self.config.url, content=body, headers=headers)
        if not 200 <= status < 300:
            raise self.fail(f"the webhook answered {status}")
        return str(answer.get("id") or delivery) if isinstance(answer, dict) else delivery

    def send(self, message: Outgoing) -> str:
        return self._post(
            {
                "event": "message",
                "id": message.delivery_id,
                "channel": self.name,
                "target": message.target,
                "subject": message.subject,
                "text": message.text,
                "attachments": [
                    {
                        "name": a.name,
                        "mime": a.mime,
                        "size": len(a.data),
                        "sha256": a.sha256,
                        "data_base64": _b64(a.data),
                    }
                    for a in message.attachments
                ],
            },
            message.delivery_id,
        )

    def edit(self, target: str, message_id: str, text: str) -> str:
        delivery = uuid.uuid4().hex
        self._post(
            {
                "event": "edit",
                "id": message_id,
                "channel": self.name,
                "target": target,
                "text": text,
            },
            delivery,
        )
        return message_id


class Slack(Channel):
    """An incoming webhook (`url`: text only, no id, no edits) or the Web API with a bot
    token (`token_env`: chat.postMessage answers the message's `ts`, chat.update edits)."""

    @property
    def edits(self) -> bool:
        return bool(self.config.token_env)  # an incoming webhook gives no message to edit

    def api(self, method: str, payload: dict[str, Any]) -> dict[str, Any]:
        token = self.secret(self.config.token_env, "token")
        base = (self.config.api_base or "https://slack.com/api").rstrip("/")
        status, answer = self.post(
            f"{base}/{method}",
            json=payload,
            headers={"Authorization": f"Bearer {token}"},
        )
        if status == 429:
            raise self.fail("Slack is rate limiting; try again later")
        if not isinstance(answer, dict) or not answer.get("ok"):
            error = answer.get("error") if isinstance(answer, dict) else f"HTTP {status}"
            raise self.fail(f"Slack {method} failed: {error}")
        return answer

    def send(self, message: Outgoing) -> str:
        if message.attachments:
            raise ChannelError(
                f"{self.name}: Slack attachments are not supported here; link the artifact"
            )
        if not self.config.token_env:
            status, answer = self.post(self.config.url, json={"text": message.text})
            if status != 200:
                raise self.fail(f"the Slack webhook answered {status}: {answer}")
            return message.delivery_id  # an incoming webhook gives no message id
        if not message.target:
            raise ChannelError(f"{self.name}: a Slack send needs target (a channel id)")
        answer = self.api("chat.postMessage", {"channel": message.target, "text": message.text})
        return str(answer.get("ts", ""))

    def edit(self, target: str, message_id: str, text: str) -> str:
        if not self.config.token_env:
            raise ChannelError(f"channel {self.name} is an incoming webhook: it cannot edit")
        answer = self.api("chat.update", {"channel": target, "ts": message_id, "text": text})
        return str(answer.get("ts", message_id))


class Telegram(Channel):
    """The Bot API: sendMessage, sendDocument for each attachment, editMessageText."""

    def call(self, method: str, **kwargs: Any) -> dict[str, Any]:
        token = self.secret(self.config.token_env, "token")
        base = (self.config.api_base or "https://api.telegram.org").rstrip("/")
        status, answer = self.post(f"{base}/bot{token}/{method}", **kwargs)
        if not isinstance(answer, dict) or not answer.get("ok"):
            what = answer.get("description") if isinstance(answer, dict) else f"HTTP {status}"
            retry = (
                (answer.get("parameters") or {}).get("retry_after")
                if isinstance(answer, dict)
                else None
            )
            hint = f"; retry after {retry} s" if retry else ""
            raise self.fail(f"Telegram {method} failed: {what}{hint}")
        result = answer.get("result")
        return result if isinstance(result, dict) else {}

    def send(self, message: Outgoing) -> str:
        if not message.target:
            raise ChannelError(f"{self.name}: a Telegram send needs target (a chat id)")
        first = ""
        if message.text:
            sent = self.call("sendMessage", json={"chat_id": message.target, "text": message.text})
            first = str(sent.get("message_id", ""))
        for a in message.attachments:
            sent = self.call(
                "sendDocument",
                data={"chat_id": message.target},
                files={"document": (a.name, a.data, a.mime)},
            )
            first = first or str(sent.get("message_id", ""))
        return first

    def edit(self, target: str, message_id: str, text: str) -> str:
        self.call(
            "editMessageText", json={"chat_id": target, "message_id": int(message_id), "text": text}
        )
        return message_id


class Email(Channel):
    """SMTP, upgraded with STARTTLS (refused if the server cannot), logged in when a
    username is set; the Message-ID is ours, so it is the provider message id."""

    @property
    def edits(self) -> bool:
        return False

    def send(self, message: Outgoing) -> str:
        c = self.config
        if not message.target or "@" not in message.target:
            raise ChannelError(f"{self.name}: an email needs target (an address)")
        mail = EmailMessage()
        mail["From"] = c.sender
        mail["To"] = message.target
        mail["Subject"] = message.subject or message.text.split("\n", 1)[0][:78]
        domain = c.sender.rpartition("@")[2] or "clawq.local"
        mail["Message-ID"] = make_msgid(idstring=message.delivery_id, domain=domain)
        mail.set_content(message.text)
        for a in message.attachments:
            main, _, sub = a.mime.partition("/")
            mail.add_attachment(
                a.data, maintype=main, subtype=sub or "octet-stream", filename=a.name
            )
        password = self.secret(c.password_env, "password") if c.username else ""
        try:
            policy = EgressPolicy.from_settings(self.settings)
            with GuardedSMTP(
                policy, c.host, c.port, timeout=self.settings.message_timeout_s
            ) as smtp:
                smtp.ehlo()
                if c.starttls:
                    context = ssl.create_default_context(cafile=c.ca_file or None)
                    smtp.starttls(context=context)
                    smtp.ehlo()
                if c.username:
                    smtp.login(c.username, password)
                smtp.send_message(mail)
        except EgressError as exc:  # refused before connecting: nothing was sent
            raise self.fail(exc.reason) from None
        except (
            smtplib.SMTPRecipientsRefused,
            smtplib.SMTPSenderRefused,
            smtplib.SMTPAuthenticationError,
            smtplib.SMTPNotSupportedError,
            smtplib.SMTPConnectError,
            ConnectionRefusedError,
            ssl.SSLError,
        ) as exc:
            raise self.fail(_short(exc)) from None
        except (smtplib.SMTPException, OSError) as exc:  # it may have been accepted
            raise self.fail(_short(exc), sent_maybe=True) from None
        return str(mail["Message-ID"])


class GuardedSMTP(smtplib.SMTP):
    """SMTP connected only to an address the egress policy allows (the host resolved and
    every answer checked, as for any request); STARTTLS still verifies the host's name."""

    def __init__(self, policy: EgressPolicy, *args: Any, **kwargs: Any) -> None:
        self.policy = policy
        super().__init__(*args, **kwargs)

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        found = checked_addresses(host, port, self.policy)
        return socket.create_connection((found[0], port), timeout, self.source_address)


KINDS: dict[str, type[Channel]] = {
    "webhook": Webhook,
    "slack": Slack,
    "telegram": Telegram,
    "email": Email,
}


def channel(name: str, settings: Settings) -> Channel:
    config = settings.message_channels[name]
    return KINDS[config.kind](name, config, settings)


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


def _short(exc: Exception) -> str:
    return (str(exc) or type(exc).__name__)[:300]
