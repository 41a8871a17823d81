"""message: send (or edit) a message on a configured channel (group messaging).

GoClaw's defaults and guards: the channel and target default to where the job's prompt
came from; text to that very chat is refused (it is the job's answer, which the caller
delivers); any target other than the origin or the channel's default needs `forward=true`
and a reason, which is logged and noted to the origin. An edit obeys the same rule, and
changes only a message this job or its session sent (the outbox row of that send says
so), never one whose id came from anywhere else. Delivery goes through the outbox
(broker/stores/message_outbox.py), so a redelivered call returns its first send's message id and
sends nothing; each channel has a cluster-wide rate limit in Redis."""

from __future__ import annotations

import logging
import time
from typing import Literal

from pydantic import Field

from broker import keys
from broker.protocol import Group
from broker.redis.ratelimit import SyncWindow
from broker.stores.message_outbox import Outbox
from workers.tool import SideEffect, Tool, ToolContext, ToolError, ToolInput, ToolResult
from workers.tools.messaging.channels import (
    Attachment,
    Channel,
    ChannelError,
    Outgoing,
    channel,
    delivery_id,
)

log = logging.getLogger("clawq.message")
RATE_WAIT_MAX_S = 10.0  # a full window is waited out up to this long, then refused


class MessageInput(ToolInput):
    action: Literal["send", "edit"] = "send"
    channel: str | None = Field(None, description="a configured channel; default: the origin")
    target: str | None = Field(
        None, description="chat id, Slack channel or email address; default: the origin chat"
    )
    text: str = Field("", description="the message")
    subject: str = Field("", max_length=200, description="email: the subject")
    attachments: list[str] = Field(default_factory=list, description="artifact ids to attach")
    message_id: str | None = Field(
        None, description="edit: the id a send of this session returned (same channel, target)"
    )
    forward: bool = Field(False, description="send or edit in a chat other than the origin")
    reason: str = Field("", max_length=500, description="forward: why (logged, told to origin)")


class Message(Tool[MessageInput]):
    name = "message"
    description = (
        "Send a message (text and artifact attachments) to a chat on a configured channel, "
        "or edit one. Defaults to the chat this job came from; your normal reply already "
        "answers that chat, so use this for files or for other chats (forward=true with a "
        "reason). Returns the provider's message id."
    )
    group = Group.messaging
    input_model = MessageInput
    side_effect = SideEffect.write
    default_permission = "ask"
    timeout_s = 60.0

    def summary(self, args: MessageInput) -> str:
        where = f"{args.channel or 'origin'}:{args.target or 'origin'}"
        return f"message({args.action} {where})"

    def run(self, args: MessageInput, ctx: ToolContext) -> ToolResult:
        if ctx.store is None or ctx.redis is None:
            raise ToolError("message needs the database and Redis; neither is configured here")
        s = ctx.settings
        name = args.channel or ctx.context.channel
        if not s.message_channels:
            raise ToolError("no message channels are configured (CLAWQ_MESSAGE_CHANNELS)")
        if not name:
            raise ToolError("this job has no origin channel: give channel, one of " + _names(ctx))
        if name not in s.message_channels:
            raise ToolError(f"unknown channel {name!r}; configured: {_names(ctx)}")
        chan = channel(name, s)
        origin = name == ctx.context.channel and bool(ctx.context.channel)
        target = args.target or (ctx.context.chat_id if origin else chan.config.default_target)
        to_origin = origin and target == ctx.context.chat_id
        own = to_origin or target == chan.config.default_target
        if len(args.text) > s.message_max_chars:
            raise ToolError(
                f"text is {len(args.text)} characters; the cap is {s.message_max_chars}"
            )
        if args.action == "edit":
            if not args.message_id or not args.text:
                raise ToolError("edit needs message_id (from the send) and text")
            if not chan.edits:
                raise ToolError(f"channel {name} ({chan.config.kind}) cannot edit a message")
        elif not args.text and not args.attachments:
            raise ToolError("send needs text or attachments")
        elif to_origin and args.text and not args.attachments:
            raise ToolError(
                "that is the chat you are answering: put this text in your reply instead "
                "(message is for attachments, or other chats with forward=true)"
            )
        if not own and not (args.forward and args.reason.strip()):
            raise ToolError(
                f"{args.action}: {name}:{target} is not where this job came from: set "
                "forward=true and give a reason (it is logged and told to the origin)"
            )
        outbox = Outbox(ctx.store().conn)
        if args.action == "edit":
            return self._edit(args, ctx, chan, target, own, outbox)
        attachments = self._attachments(args, ctx)
        key = f"{ctx.job_id}:{ctx.turn}:{ctx.call_id}"
        reason = args.reason if not own else ""
        claim = outbox.claim(key, ctx.job_id, name, target, "send", reason, ctx.session_id)
        if not claim.send:
            return _earlier("send", claim.row.status, claim.row.provider_id, name, target)
        self._admit(ctx, name)
        outgoing = Outgoing(target, args.text, delivery_id(key), args.subject, attachments)
        try:
            provider_id = chan.send(outgoing)
        except ChannelError as exc:
            outbox.failed(key, str(exc), outcome_known=not exc.sent_maybe)
            if exc.sent_maybe:
                return _earlier("send", "unknown", "", name, target)
            raise ToolError(str(exc)) from None
        outbox.sent(key, provider_id)
        if not own:
            log.info("job %s forwarded to %s:%s: %s", ctx.job_id, name, target, args.reason)
            self._note_origin(ctx, key, f"Forwarded a message to {name}:{target}", args.reason)
        return ToolResult(
            for_llm=f"sent to {name}:{target}; message id {provider_id}",
            metadata={"channel": name, "target": target, "message_id": provider_id},
        )

    def _edit(
        self,
        args: MessageInput,
        ctx: ToolContext,
        chan: Channel,
        target: str,
        own: bool,
        outbox: Outbox,
    ) -> ToolResult:
        """Edit a message this job or its session sent to `target`: the send's outbox row
        is the proof, since an id from elsewhere (a page, another user's chat) would let
        the model rewrite somebody else's words. Claimed in the outbox like a send."""
        assert args.message_id
        name = chan.name
        if outbox.sent_by(name, target, args.message_id, ctx.job_id, ctx.session_id) is None:
            raise ToolError(
                f"edit: message {args.message_id} in {name}:{target} was not sent by this "
                "session; give the message id, channel and target of one of its own sends"
            )
        key = f"{ctx.job_id}:{ctx.turn}:{ctx.call_id}"
        reason = args.reason if not own else ""
        claim = outbox.claim(key, ctx.job_id, name, target, "edit", reason, ctx.session_id)
        if not claim.send:
            return _earlier("edit", claim.row.status, claim.row.provider_id, name, target)
        self._admit(ctx, name)
        try:
            provider_id = chan.edit(target, args.message_id, args.text)
        except ChannelError as exc:
            outbox.failed(key, str(exc), outcome_known=not exc.sent_maybe)
            raise ToolError(str(exc)) from None
        outbox.sent(key, provider_id)
        if not own:
            log.info("job %s edited in %s:%s: %s", ctx.job_id, name, target, args.reason)
            self._note_origin(ctx, key, f"Edited a message in {name}:{target}", args.reason)
        return ToolResult(
            for_llm=f"edited {chan.name}:{target} message {provider_id}",
            metadata={"channel": chan.name, "target": target, "message_id": provider_id},
        )

    def _attachments(self, args: MessageInput, ctx: ToolContext) -> list[Attachment]:
        from broker.stores.artifacts import ArtifactError, ArtifactStore

        if len(args.attachments) > ctx.settings.message_max_attachments:
            raise ToolError(f"at most {ctx.settings.message_max_attachments} attachments")
        store = ArtifactStore(ctx.store().conn, ctx.settings)  # type: ignore[misc]
        out = []
        for artifact_id in args.attachments:
            found = store.get(artifact_id)
            if found is None or found.user_id != ctx.context.user_id:
                raise ToolError(f"there is no artifact {artifact_id} (or it has expired)")
            try:
                data = store.read(found)
            except ArtifactError as exc:
                raise ToolError(str(exc)) from None
            out.append(Attachment(found.name or found.id, found.mime, data, found.hash))
        return out

    def _admit(self, ctx: ToolContext, name: str) -> None:
        """One slot of the channel's per-minute window, waited for up to a few seconds."""
        window = SyncWindow(
            ctx.redis,  # type: ignore[arg-type]
            keys.rate(f"channel:{name}"),
            ctx.settings.message_rate_per_minute,
            60.0,
        )
        deadline = time.monotonic() + RATE_WAIT_MAX_S
        while True:
            ok, wait = window.take()
            if ok:
                return
            if time.monotonic() + wait > deadline:
                raise ToolError(
                    f"channel {name} is at its limit of {ctx.settings.message_rate_per_minute}"
                    f" messages a minute; try again in {wait:.0f} s"
                )
            time.sleep(min(wait, 1.0) + 0.01)

    def _note_origin(self, ctx: ToolContext, key: str, what: str, reason: str) -> None:
        """Tell the origin chat where its agent forwarded (or edited) something, and why
        (best effort: the forward itself is done)."""
        origin = ctx.context.channel
        if not origin or origin not in ctx.settings.message_channels:
            return
        note_key = key + ":note"
        outbox = Outbox(ctx.store().conn)  # type: ignore[misc]
        claim = outbox.claim(
            note_key, ctx.job_id, origin, ctx.context.chat_id, "note", "", ctx.session_id
        )
        if not claim.send:
            return
        text = f"{what}. Reason: {reason}"
        try:
            provider_id = channel(origin, ctx.settings).send(
                Outgoing(ctx.context.chat_id, text, delivery_id(note_key))
            )
            outbox.sent(note_key, provider_id)
        except ChannelError as exc:
            outbox.failed(note_key, str(exc), outcome_known=not exc.sent_maybe)
            log.warning("noting a forward to the origin failed: %s", exc)


def _earlier(action: str, status: str, provider_id: str, name: str, target: str) -> ToolResult:
    did, where = ("sent", "to") if action == "send" else ("edited", "in")
    if status == "sent":
        return ToolResult(
            for_llm=f"{did} {where} {name}:{target}; message id {provider_id} (already {did} by"
            " an earlier attempt of this call; not sent again)",
            metadata={"channel": name, "target": target, "message_id": provider_id},
        )
    return ToolResult.error(
        f"the outcome of this {action} to {name}:{target} is unknown: an earlier attempt stopped "
        "while the provider had it. It was not sent again, so as not to send it twice; check "
        "the chat before sending it once more (with a new call)."
    )


def _names(ctx: ToolContext) -> str:
    return ", ".join(sorted(ctx.settings.message_channels)) or "none"


TOOLS = [Message]
