"""message against real local receivers: HTTP servers that speak the documented request
shapes of a signed webhook, Slack (an incoming webhook; chat.postMessage and chat.update
with a bot token) and Telegram's Bot API (sendMessage, sendDocument, editMessageText), and
aiosmtpd, a real SMTP server, with STARTTLS on a certificate made for the test. Plus the
guards (self-sends, forwards), the outbox (a repeated call sends nothing) and the rate
limit, on real Redis and PostgreSQL."""

from __future__ import annotations

import contextlib
import datetime as dt
import email
import hashlib
import hmac
import json
import socket
import ssl
import struct
import threading
import uuid
from collections.abc import Iterator
from email.message import Message as Mail
from pathlib import Path
from typing import Any

import pytest
import redis

from broker.config.settings import Settings
from broker.pg.store import Store
from broker.protocol import CallContext
from broker.stores.artifacts import ArtifactStore
from broker.stores.message_outbox import Outbox
from tests.conftest import Isolated
from tests.sites import Reply, Seen, Site
from workers.execute import run_tool
from workers.registry import default_registry
from workers.tool import ToolContext, ToolResult
from workers.tools.messaging.channels import SIGNATURE_HEADER, TIMESTAMP_HEADER

REGISTRY = default_registry()
SECRET, SLACK_TOKEN, TG_TOKEN = "whsec-test", "xoxb-test-token", "123456:TEST-token"
SMTP_PASSWORD = "smtp-pass"


class Receivers:
    """What each local provider got, checked against its documented shape as it came in."""

    def __init__(self) -> None:
        self.hooks: list[dict[str, Any]] = []
        self.slack: list[tuple[str, dict[str, Any]]] = []
        self.telegram: list[tuple[str, Seen]] = []
        self.bad: list[str] = []  # requests that broke the documented shape

    def webhook(self, seen: Seen) -> Reply:
        stamp = seen.headers.get(TIMESTAMP_HEADER.lower(), "")
        mac = hmac.new(SECRET.encode(), stamp.encode() + b"." + seen.body, hashlib.sha256)
        if seen.headers.get(SIGNATURE_HEADER.lower()) != "sha256=" + mac.hexdigest():
            self.bad.append("webhook signature")
            return Reply(401, b"bad signature")
        self.hooks.append(seen.json())
        return Reply(200, b'{"received": true}', "application/json")

    def slack_incoming(self, seen: Seen) -> Reply:
        body = seen.json()
        if set(body) != {"text"}:
            self.bad.append(f"slack incoming {body}")
            return Reply(400, b"invalid_payload")
        self.slack.append(("incoming", body))
        return Reply(200, b"ok")

    def slack_api(self, seen: Seen) -> Reply:
        if seen.headers.get("authorization") != f"Bearer {SLACK_TOKEN}":
            return Reply(200, b'{"ok": false, "error": "invalid_auth"}', "application/json")
        method, body = seen.path.rsplit("/", 1)[1], seen.json()
        if body.get("channel") == "C-echo":  # a provider quoting what it was sent
            said = {"ok": False, "error": f"invalid_auth: {seen.headers['authorization']}"}
            return Reply(200, json.dumps(said).encode(), "application/json")
        if body.get("channel") == "C-missing":
            return Reply(200, b'{"ok": false, "error": "channel_not_found"}', "application/json")
        self.slack.append((method, body))
        ts = body.get("ts") or f"17000000{len(self.slack)}.000100"
        answer = {"ok": True, "channel": body["channel"], "ts": ts}
        return Reply(200, json.dumps(answer).encode(), "application/json")

    def telegram_api(self, seen: Seen) -> Reply:
        prefix, method = seen.path.rsplit("/", 1)
        if prefix != f"/bot{TG_TOKEN}":
            return Reply(401, b'{"ok": false, "error_code": 401, "description": "Unauthorized"}')
        if method == "sendDocument":
            ok = b'name="chat_id"' in seen.body and b'name="document"' in seen.body
            chat = seen.body.split(b'name="chat_id"\r\n\r\n', 1)[1].split(b"\r\n", 1)[0].decode()
        else:
            body = seen.json()
            ok, chat = "chat_id" in body and "text" in body, str(body.get("chat_id"))
        if not ok:
            self.bad.append(f"telegram {method}")
            return Reply(400, b'{"ok": false, "error_code": 400, "description": "Bad Request"}')
        if chat == "echo":  # a provider quoting the request path, the token in it
            said = {"ok": False, "error_code": 404, "description": f"Not Found: {seen.path}"}
            return Reply(404, json.dumps(said).encode(), "application/json")
        if chat == "404":
            return Reply(
                400,
                b'{"ok": false, "error_code": 400, "description": "Bad Request: chat not found"}',
                "application/json",
            )
        self.telegram.append((method, seen))
        result = {"message_id": 100 + len(self.telegram), "chat": {"id": chat}}
        return Reply(200, json.dumps({"ok": True, "result": result}).encode(), "application/json")


@pytest.fixture(scope="module")
def receivers() -> Iterator[tuple[Receivers, Site]]:
    got = Receivers()
    routes: dict[str, Any] = {
        "/hook": got.webhook,
        "/slack-incoming": got.slack_incoming,
        "/api/chat.postMessage": got.slack_api,
        "/api/chat.update": got.slack_api,
    }
    for method in ("sendMessage", "sendDocument", "editMessageText"):
        routes[f"/bot{TG_TOKEN}/{method}"] = got.telegram_api
    with Site(routes) as site:
        yield got, site


class Mailbox:
    """aiosmtpd's handler: every message it accepted."""

    def __init__(self) -> None:
        self.mails: list[Mail] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.mails.append(email.message_from_bytes(envelope.content))
        return "250 OK"


def certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (the test trusts it through ca_file)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture(scope="module")
def smtp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Mailbox, int, Path]]:
    import socket

    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult, LoginPassword

    def authenticate(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> Any:
        ok = isinstance(data, LoginPassword) and data.password == SMTP_PASSWORD.encode()
        return AuthResult(success=ok, handled=False)  # aiosmtpd answers 535 on a failure

    cert, key = certificate(tmp_path_factory.mktemp("tls"))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    box = Mailbox()
    controller = Controller(
        box,
        hostname="127.0.0.1",
        port=port,
        tls_context=context,
        require_starttls=True,
        authenticator=authenticate,
        auth_required=True,
    )
    controller.start()
    try:
        yield box, port, cert
    finally:
        controller.stop()


@pytest.fixture
def settings(
    isolated: Isolated,
    receivers: tuple[Receivers, Site],
    smtp: tuple[Mailbox, int, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> Settings:
    _, site = receivers
    _, port, cert = smtp
    for env, value in (
        ("TEST_HOOK_SECRET", SECRET),
        ("TEST_SLACK_TOKEN", SLACK_TOKEN),
        ("TEST_TG_TOKEN", TG_TOKEN),
        ("TEST_SMTP_PASSWORD", SMTP_PASSWORD),
    ):
        monkeypatch.setenv(env, value)
    channels = {
        "hook": {"kind": "webhook", "url": site.url + "/hook", "secret_env": "TEST_HOOK_SECRET"},
        "team": {"kind": "slack", "url": site.url + "/slack-incoming"},
        "slackbot": {
            "kind": "slack",
            "token_env": "TEST_SLACK_TOKEN",
            "api_base": site.url + "/api",
            "default_target": "C-general",
        },
        "tg": {"kind": "telegram", "token_env": "TEST_TG_TOKEN", "api_base": site.url},
        "mail": {
            "kind": "email",
            "host": "127.0.0.1",
            "port": port,
            "username": "clawq",
            "password_env": "TEST_SMTP_PASSWORD",
            "sender": "agent@clawq.test",
            "ca_file": str(cert),
        },
    }
    return isolated.settings.model_copy(
        update={
            "message_channels": Settings.model_validate(
                {"message_channels": channels}
            ).message_channels,
            "web_private_allow": [site.endpoint, f"127.0.0.1:{port}"],  # the SMTP server too
        }
    )


def send(
    settings: Settings,
    *,
    origin: tuple[str, str] = ("", ""),
    call: str = "",
    job: str = "job-1",
    user: str = "ann",
    session: str = "s-1",
    **args: Any,
) -> ToolResult:
    store = Store(settings.database_url)
    client = redis.Redis.from_url(settings.redis_url)
    try:
        ctx = ToolContext(
            CallContext(workspace="/tmp", user_id=user, channel=origin[0], chat_id=origin[1]),
            settings,
            job_id=job,
            call_id=call or uuid.uuid4().hex,
            session_id=session,
            store=lambda: store,
            redis=client,
        )
        return run_tool(REGISTRY, "message", args, ctx)
    finally:
        client.close()
        store.close()


def test_a_signed_webhook_is_sent_once_per_call(
    settings: Settings, receivers: tuple[Receivers, Site]
) -> None:
    got, _ = receivers
    before = len(got.hooks)
    first = send(settings, channel="hook", call="c1", text="deploy finished")
    assert not first.is_error, first.for_llm
    (hook,) = got.hooks[before:]
    assert hook["event"] == "message" and hook["text"] == "deploy finished"
    assert first.metadata["message_id"] == hook["id"]

    again = send(settings, channel="hook", call="c1", text="deploy finished")  # redelivered
    assert not again.is_error and "not sent again" in again.for_llm
    assert again.metadata["message_id"] == first.metadata["message_id"]
    assert len(got.hooks) == before + 1 and not got.bad


def test_slack_incoming_webhook_and_web_api_send_and_edit(
    settings: Settings, receivers: tuple[Receivers, Site]
) -> None:
    got, _ = receivers
    incoming = send(settings, channel="team", text="standup in 5")
    assert not incoming.is_error, incoming.for_llm
    assert ("incoming", {"text": "standup in 5"}) in got.slack

    posted = send(settings, channel="slackbot", text="build is green")  # the default target
    assert not posted.is_error, posted.for_llm
    ts = posted.metadata["message_id"]
    assert ("chat.postMessage", {"channel": "C-general", "text": "build is green"}) in got.slack
    edited = send(settings, channel="slackbot", action="edit", message_id=ts, text="build is red")
    assert not edited.is_error, edited.for_llm
    assert ("chat.update", {"channel": "C-general", "ts": ts, "text": "build is red"}) in got.slack

    missing = send(
        settings,
        channel="slackbot",
        target="C-missing",
        text="x",
        forward=True,
        reason="the other team asked for it",
    )
    assert missing.is_error and "channel_not_found" in missing.for_llm
    cannot = send(settings, channel="team", action="edit", message_id="1", text="y")
    assert cannot.is_error and "cannot edit" in cannot.for_llm


def test_telegram_text_attachment_and_edit(
    settings: Settings, receivers: tuple[Receivers, Site]
) -> None:
    got, _ = receivers
    store = Store(settings.database_url)
    try:
        report = ArtifactStore(store.conn, settings).put(
            b"%PDF-1.4 report", "application/pdf", user_id="ann", name="report.pdf"
        )
        bobs = ArtifactStore(store.conn, settings).put(b"secret", "text/plain", user_id="bob")
    finally:
        store.close()
    sent = send(settings, origin=("tg", "42"), text="here is the report", attachments=[report.id])
    assert not sent.is_error, sent.for_llm
    methods = [m for m, _ in got.telegram[-2:]]
    assert methods == ["sendMessage", "sendDocument"]
    document = got.telegram[-1][1]
    assert b"%PDF-1.4 report" in document.body and b'filename="report.pdf"' in document.body
    message_id = sent.metadata["message_id"]
    edited = send(settings, origin=("tg", "42"), action="edit", message_id=message_id, text="v2")
    assert not edited.is_error and got.telegram[-1][0] == "editMessageText"
    assert got.telegram[-1][1].json() == {
        "chat_id": "42",
        "message_id": int(message_id),
        "text": "v2",
    }

    foreign = send(settings, origin=("tg", "42"), attachments=[bobs.id])
    assert foreign.is_error and "no artifact" in foreign.for_llm  # another user's artifact
    lost = send(settings, channel="tg", target="404", text="x", forward=True, reason="asked to")
    assert lost.is_error and "chat not found" in lost.for_llm and TG_TOKEN not in lost.for_llm


def test_email_over_starttls_with_login_and_an_attachment(
    settings: Settings, smtp: tuple[Mailbox, int, Path]
) -> None:
    box, _, _ = smtp
    store = Store(settings.database_url)
    try:
        chart = ArtifactStore(store.conn, settings).put(
            b"\x89PNG chart", "image/png", user_id="ann", name="chart.png"
        )
    finally:
        store.close()
    sent = send(
        settings,
        channel="mail",
        target="boss@example.test",
        subject="Weekly numbers",
        text="Numbers attached.",
        attachments=[chart.id],
        forward=True,
        reason="the user asked to mail their manager",
    )
    assert not sent.is_error, sent.for_llm
    mail = box.mails[-1]
    assert mail["To"] == "boss@example.test" and mail["Subject"] == "Weekly numbers"
    assert mail["Message-ID"] == sent.metadata["message_id"]
    parts = {p.get_content_type(): p for p in mail.walk()}
    assert parts["image/png"].get_payload(decode=True) == b"\x89PNG chart"

    wrong = settings.model_copy(deep=True)
    wrong.message_channels["mail"].password_env = "TEST_HOOK_SECRET"  # a wrong password
    refused = send(
        wrong, channel="mail", target="a@example.test", text="x", forward=True, reason="testing"
    )
    assert (
        refused.is_error
        and SECRET not in refused.for_llm
        and SMTP_PASSWORD not in (refused.for_llm)
    )


def test_self_sends_and_unexplained_forwards_are_refused(
    settings: Settings, receivers: tuple[Receivers, Site]
) -> None:
    got, _ = receivers
    before = len(got.telegram)
    own = send(settings, origin=("tg", "42"), text="the answer is 4")
    assert own.is_error and "put this text in your reply" in own.for_llm
    same = send(settings, origin=("tg", "42"), target="42", text="the answer is 4")
    assert same.is_error and "put this text in your reply" in same.for_llm
    elsewhere = send(settings, origin=("tg", "42"), target="77", text="psst")
    assert elsewhere.is_error and "forward=true" in elsewhere.for_llm
    no_reason = send(settings, origin=("tg", "42"), target="77", text="psst", forward=True)
    assert no_reason.is_error and "reason" in no_reason.for_llm
    assert len(got.telegram) == before  # nothing reached Telegram

    forwarded = send(
        settings,
        origin=("tg", "42"),
        target="77",
        text="psst",
        forward=True,
        reason="the user asked to tell Bob",
    )
    assert not forwarded.is_error, forwarded.for_llm
    (to_bob, note) = got.telegram[before:]
    assert to_bob[1].json() == {"chat_id": "77", "text": "psst"}
    assert (
        note[1].json()["chat_id"] == "42"
        and "the user asked to tell Bob" in (note[1].json()["text"])
    )
    store = Store(settings.database_url)
    try:
        reasons = store.conn.execute(
            "SELECT forward_reason FROM message_outbox WHERE target = '77'"
        ).fetchall()
        assert [r["forward_reason"] for r in reasons] == ["the user asked to tell Bob"]
    finally:
        store.close()


def test_an_edit_changes_only_a_message_this_session_sent(
    settings: Settings, receivers: tuple[Receivers, Site]
) -> None:
    """A message id is not a capability: another session (another user's, here) that
    learns one may not rewrite the message; a later job of the sending session may."""
    got, site = receivers
    sent = send(settings, channel="slackbot", job="job-a1", session="s-ann", text="v1")
    assert not sent.is_error, sent.for_llm
    ts = sent.metadata["message_id"]

    before = len(site.seen)
    other = send(
        settings,
        channel="slackbot",
        job="job-b1",
        session="s-bob",
        user="bob",
        action="edit",
        message_id=ts,
        text="rewritten by bob",
    )
    assert other.is_error and f"message {ts}" in other.for_llm, other.for_llm
    assert "was not sent by this session" in other.for_llm
    unknown = send(
        settings,
        channel="slackbot",
        job="job-a1",
        session="s-ann",
        action="edit",
        message_id="1.000",
        text="x",
    )
    assert unknown.is_error and "was not sent by this session" in unknown.for_llm
    assert len(site.seen) == before  # the provider was never asked

    later = send(  # a later job of the same session
        settings,
        channel="slackbot",
        job="job-a2",
        session="s-ann",
        action="edit",
        message_id=ts,
        text="v2",
    )
    assert not later.is_error, later.for_llm
    assert ("chat.update", {"channel": "C-general", "ts": ts, "text": "v2"}) in got.slack
    assert len(site.seen) == before + 1


def test_an_edit_elsewhere_needs_a_forward_like_a_send(
    settings: Settings, receivers: tuple[Receivers, Site]
) -> None:
    got, site = receivers
    forwarded = send(
        settings,
        origin=("tg", "42"),
        session="s-fwd",
        target="77",
        text="psst",
        forward=True,
        reason="the user asked to tell Bob",
    )
    assert not forwarded.is_error, forwarded.for_llm
    message_id = forwarded.metadata["message_id"]

    before = len(site.seen)
    bare = send(
        settings,
        origin=("tg", "42"),
        session="s-fwd",
        target="77",
        action="edit",
        message_id=message_id,
        text="psst, again",
    )
    assert bare.is_error and "forward=true" in bare.for_llm, bare.for_llm
    unexplained = send(
        settings,
        origin=("tg", "42"),
        session="s-fwd",
        target="77",
        action="edit",
        message_id=message_id,
        text="psst, again",
        forward=True,
    )
    assert unexplained.is_error and "reason" in unexplained.for_llm
    in_origin = send(  # the same id, but in the origin chat: not a message this session sent
        settings,
        origin=("tg", "42"),
        session="s-fwd",
        action="edit",
        message_id=message_id,
        text="psst, again",
    )
    assert in_origin.is_error and "was not sent by this session" in in_origin.for_llm
    assert len(site.seen) == before

    edited = send(
        settings,
        origin=("tg", "42"),
        session="s-fwd",
        target="77",
        action="edit",
        message_id=message_id,
        text="psst, again",
        forward=True,
        reason="the user corrected it",
    )
    assert not edited.is_error, edited.for_llm
    (edit, note) = got.telegram[-2:]
    assert edit[0] == "editMessageText" and edit[1].json()["chat_id"] == "77"
    assert note[1].json()["chat_id"] == "42" and "the user corrected it" in note[1].json()["text"]
    store = Store(settings.database_url)
    try:
        rows = store.conn.execute(
            "SELECT action, session_id, forward_reason FROM message_outbox"
            " WHERE session_id = 's-fwd' AND target = '77' ORDER BY created_at"
        ).fetchall()
    finally:
        store.close()
    assert [(r["action"], r["forward_reason"]) for r in rows] == [
        ("send", "the user asked to tell Bob"),
        ("edit", "the user corrected it"),
    ]


def test_an_unknown_outcome_is_not_sent_again(
    settings: Settings, receivers: tuple[Receivers, Site]
) -> None:
    """An earlier delivery claimed the row and died while the provider had the message."""
    got, _ = receivers
    store = Store(settings.database_url)
    try:
        Outbox(store.conn).claim("job-2:0:c9", "job-2", "hook", "", "send")
    finally:
        store.close()
    before = len(got.hooks)
    result = send(settings, channel="hook", job="job-2", call="c9", text="hello")
    assert result.is_error and "unknown" in result.for_llm and "not sent again" in result.for_llm
    assert len(got.hooks) == before


def test_the_channel_rate_limit_holds(
    settings: Settings, receivers: tuple[Receivers, Site]
) -> None:
    limited = settings.model_copy(update={"message_rate_per_minute": 2})
    results = [send(limited, channel="hook", text=f"n{i}") for i in range(3)]
    assert [r.is_error for r in results] == [False, False, True]
    assert "limit of 2 messages a minute" in results[2].for_llm


def test_provider_error_text_passes_the_channels_redaction(
    settings: Settings, receivers: tuple[Receivers, Site]
) -> None:
    """Run without the worker's scrubber: the channel's own redaction alone must hold,
    since its errors are also kept in the outbox."""
    slack = send(settings, channel="slackbot", target="C-echo", forward=True, reason="t", text="x")
    assert slack.is_error and "Slack chat.postMessage failed: invalid_auth: Bearer ***" in (
        slack.for_llm
    ), slack.for_llm
    telegram = send(settings, channel="tg", target="echo", forward=True, reason="t", text="x")
    assert telegram.is_error and "Not Found: /bot***/sendMessage" in telegram.for_llm, (
        telegram.for_llm
    )
    store = Store(settings.database_url)
    try:
        errors = [r["error"] for r in store.conn.execute("SELECT error FROM message_outbox")]
    finally:
        store.close()
    assert len(errors) == 2 and all("***" in e for e in errors)
    for text in [slack.for_llm, telegram.for_llm, *errors]:
        assert SLACK_TOKEN not in text and TG_TOKEN not in text


def test_an_smtp_host_on_a_blocked_address_is_never_connected_to(settings: Settings) -> None:
    """SMTP meets the egress guard too: the same server, without its exemption."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        mail = settings.message_channels["mail"].model_copy(update={"port": port})
        blocked = settings.model_copy(
            update={"message_channels": {**settings.message_channels, "mail": mail}}
        )
        result = send(
            blocked,
            channel="mail",
            target="bob@example.com",
            forward=True,
            reason="t",
            text="hello",
        )
        with pytest.raises(TimeoutError):
            listener.accept()  # nobody knocked
    assert result.is_error and "127.0.0.1, a loopback address" in result.for_llm, result.for_llm


class Stubborn:
    """A TCP endpoint that takes a request and then, by `mode`, never answers (`silent`)
    or drops the connection (`reset`): the request reached it, the answer never came."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.requests = 0
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            conn.settimeout(5)
            with contextlib.suppress(OSError):
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                self.requests += 1
            if self.mode == "reset":  # an RST, not a clean end
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
            else:
                self.held.append(conn)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for conn in self.held:
            conn.close()
        self.server.close()


def test_what_may_have_gone_out_is_unknown_and_what_cannot_have_is_failed(
    settings: Settings,
) -> None:
    """The outbox's classification of a failed send, each against a real endpoint: a
    refused connection or a blocked address cannot have delivered (failed: the same call
    may send again); a request taken and then left unanswered, or cut after it was
    taken, may have (unknown: never sent again)."""
    silent, reset = Stubborn("silent"), Stubborn("reset")
    closed = socket.create_server(("127.0.0.1", 0))
    refused_port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    endpoints = {
        "silent": f"http://127.0.0.1:{silent.port}/hook",
        "reset": f"http://127.0.0.1:{reset.port}/hook",
        "refused": f"http://127.0.0.1:{refused_port}/hook",
        "blocked": "http://10.255.255.1/hook",  # a private address the policy refuses
    }
    channels = {
        name: {"kind": "webhook", "url": url, "secret_env": "TEST_HOOK_SECRET"}
        for name, url in endpoints.items()
    }
    fast = settings.model_copy(
        update={
            "message_channels": Settings.model_validate(
                {"message_channels": channels}
            ).message_channels,
            "web_private_allow": [
                f"127.0.0.1:{port}" for port in (silent.port, reset.port, refused_port)
            ],
            "web_read_timeout_s": 1.0,
        }
    )
    try:
        outcomes = {}
        for name in endpoints:
            first = send(fast, channel=name, job="job-9", call=f"m-{name}", text="hi")
            again = send(fast, channel=name, job="job-9", call=f"m-{name}", text="hi")
            store = Store(fast.database_url)
            try:
                row = Outbox(store.conn).get(f"job-9:0:m-{name}")
            finally:
                store.close()
            assert row is not None and first.is_error and again.is_error, (name, first)
            outcomes[name] = (row.status, "unknown" in again.for_llm)
        assert outcomes == {
            "silent": ("unknown", True),  # read timeout: it may have gone out
            "reset": ("unknown", True),
            "refused": ("failed", False),  # nothing went out: the call tried again
            "blocked": ("failed", False),
        }
        assert (silent.requests, reset.requests) == (1, 1)  # and neither was sent twice
    finally:
        silent.close()
        reset.close()
