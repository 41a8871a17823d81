"""A job's answer written live in the chat it came from (a channel's `live_answers`): the
first text is sent (Telegram sendMessage, Slack chat.postMessage), later text edits that
message (editMessageText, chat.update), and the final text replaces it, what passes one
message's limit following in further messages.

The orchestrator keeps the newest version of what the chat should show in the job's
record (`keys.chat_preview`: version, text, final) and wakes this task; the task always
writes the newest version, so a late or repeated wake-up changes nothing. One process
writes a job's preview at a time (a lock), and every request to a chat waits for that
chat's slot (`keys.chat_slot`: one per interval, cluster-wide), so the chat never sees
more than its provider allows. The record says what was done: the version applied, the
message id, a send begun (claimed before the request), the parts of the final sent; a
send found begun but unrecorded (its process died) is not made again. A final not yet
written is looked at again by a sweeper in every messaging process, so a lost wake-up,
a dead process or a provider's failure still ends with the final in the chat, once.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import redis

from broker import keys
from broker.config.settings import Settings
from workers.tools.messaging.channels import ChannelError, Outgoing, channel, delivery_id

log = logging.getLogger("clawq.messaging")

PREVIEW_TASK = "clawq.chat.preview"
TELEGRAM_LIMIT = 4096  # UTF-16 code units of one message's text (the Bot API's limit)
TEXT_CAP = 2 * TELEGRAM_LIMIT + 8  # of a preview's text: it shows one message's worth
WORK_S = 60.0  # of one task; a longer final goes on in a new task
NOT_MODIFIED = "message is not modified"  # Telegram's answer to an edit that changes nothing

# the chat is free now: held for a request (ARGV[1] ms at most), or N ms still to wait
SLOT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local free = tonumber(redis.call('GET', KEYS[1]) or '0')
if free > now then return free - now end
redis.call('SET', KEYS[1], now + tonumber(ARGV[1]), 'PX', tonumber(ARGV[1]) + 1000)
return 0
"""
# the request is over: the chat's next one an interval (ARGV[1] ms) from now, so two
# requests reach the provider at least that far apart however long each took to go
FREE_AFTER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('SET', KEYS[1], now + tonumber(ARGV[1]), 'PX', tonumber(ARGV[1]) + 1000)
return 0
"""
POLL_S = 0.05  # how often a request waiting for its chat looks again
UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
# the finals due now, each due again `retry` later (every sweeper may run it at once)
CLAIM_DUE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 100)
for _, job in ipairs(due) do redis.call('ZADD', KEYS[1], ARGV[2], job) end
return due
"""


def units(text: str) -> int:
    """Length as Telegram counts it: UTF-16 code units."""
    return len(text.encode("utf-16-le")) // 2


def first_part(text: str, limit: int) -> str:
    """As much of `text` as one message holds, cut after a line, else a space, in its
    second half, else where it must be."""
    if units(text) <= limit:
        return text
    head = text[:limit]
    while (over := units(head) - limit) > 0:  # a character is one unit or two
        head = head[: len(head) - max(1, over // 2)]
    cut = len(head)
    for mark in ("\n", " "):
        at = head.rfind(mark)
        if at >= cut // 2:
            return head[: at + 1]
    return head


def parts(text: str, limit: int) -> list[str]:
    """`text` in messages of at most `limit` units; joined, they are `text` again (a part
    of spaces only, which no provider sends, is left out)."""
    found: list[str] = []
    while text:
        part = first_part(text, limit)
        text = text[len(part) :]
        if part.strip():
            found.append(part)
        elif found:
            found[-1] += part  # the spaces between stay with the part before
    return found


@dataclass
class Record:
    """The job's preview record: the orchestrator's fields, then the workers'."""

    version: int = 0
    channel: str = ""
    chat: str = ""
    text: str = ""
    final: bool = False
    applied: int = 0  # the version last written to the chat
    message: str = ""  # the preview message's id at the provider
    shown: str = ""  # what that message says now
    sending: str = ""  # a send begun: "preview", or a part of the final
    sent: int = 0  # parts of the final in the chat
    tries: int = 0  # of the final's requests that failed
    lost: bool = False  # the preview message is unknown (a send that may have gone)
    done: bool = False  # the final is written (or given up)

    @classmethod
    def read(cls, client: redis.Redis, job_id: str) -> Record | None:
        raw = client.hgetall(keys.chat_preview(job_id))
        if not raw:
            return None
        got = {_str(k): _str(v) for k, v in raw.items()}
        return cls(
            version=int(got.get("version", 0)),
            channel=got.get("channel", ""),
            chat=got.get("chat", ""),
            text=got.get("text", ""),
            final=got.get("final") == "1",
            applied=int(got.get("applied", 0)),
            message=got.get("message", ""),
            shown=got.get("shown", ""),
            sending=got.get("sending", ""),
            sent=int(got.get("sent", 0)),
            tries=int(got.get("tries", 0)),
            lost=got.get("lost") == "1",
            done=got.get("done") == "1",
        )


@dataclass
class Step:
    kind: Literal["send", "edit", "skip"]  # skip: recorded as done, nothing requested
    text: str
    part: int  # of the final; -1: the preview


def next_step(r: Record, limit: int) -> Step | None:
    """What the chat needs next for the record to be written, or None."""
    if r.done:
        return None
    if r.final:
        pieces = parts(r.text, limit)
        if r.sent >= len(pieces):
            return None
        piece = pieces[r.sent]
        if r.sent == 0 and r.message and not r.lost:
            return Step("skip" if piece == r.shown else "edit", piece, 0)
        return Step("send", piece, r.sent)
    if r.version <= r.applied:
        return None
    text = first_part(r.text, limit)
    if r.lost or not text.strip() or text == r.shown:
        return Step("skip", text, -1)
    return Step("edit" if r.message else "send", text, -1)


class PreviewWriter:
    """Writes one job's record to its chat; `resend(job, countdown)` wakes it again."""

    def __init__(
        self, settings: Settings, client: redis.Redis, resend: Callable[[str, float], None]
    ) -> None:
        self.settings = settings
        self.redis = client
        self.resend = resend
        self.limit = min(settings.message_max_chars, TELEGRAM_LIMIT)

    def interval_s(self, name: str) -> float:
        config = self.settings.message_channels.get(name)
        return (config.live_interval_s if config else 0) or self.settings.chat_preview_interval_s

    def request_s(self) -> float:
        """The longest one request to a provider takes (its connect and read timeouts)."""
        s = self.settings
        return max(s.message_timeout_s, s.web_connect_timeout_s + s.web_read_timeout_s) + 1

    def lock_ms(self, name: str) -> int:
        """Past one request and the longest wait for the chat's slot: a process that held
        it has its request done or given up."""
        return int((self.request_s() + 2 * self.interval_s(name) + 4) * 1000)

    def run(self, job_id: str) -> None:
        """The task: the newest version in the chat, if no other process is on it (that
        one reads the newest too; a final it leaves comes back by the sweeper)."""
        r = Record.read(self.redis, job_id)
        if r is None or r.done:
            self.redis.zrem(keys.CHAT_FINALS_DUE, job_id)
            return
        if not r.final and next_step(r, self.limit) is None:
            return  # an old wake-up: what it was for is in the chat
        lock, token = keys.chat_preview_lock(job_id), uuid.uuid4().hex
        if not self.redis.set(lock, token, nx=True, px=self.lock_ms(r.channel)):
            return
        try:
            again = self.work(job_id, lock, token)
        finally:
            self.redis.eval(UNLOCK, 1, lock, token)
        if again is not None:
            self.resend(job_id, again)

    def work(self, job_id: str, lock: str, token: str) -> float | None:
        """Requests until the record is written; the countdown for a new task when the
        rest must wait (the chat's slot is far, a failure's backoff, a long final)."""
        key = keys.chat_preview(job_id)
        until = time.monotonic() + WORK_S
        while True:
            r = Record.read(self.redis, job_id)
            if r is None:
                self.redis.zrem(keys.CHAT_FINALS_DUE, job_id)
                return None
            self.recover(key, job_id, r)
            config = self.settings.message_channels.get(r.channel)
            if config is None or not config.live_answers:  # the channel changed meanwhile
                if r.final:
                    self.finished(key, job_id, f"channel {r.channel} has no live answers now")
                return None
            step = next_step(r, self.limit)
            if step is None:
                if r.final and not r.done:
                    self.finished(key, job_id, "")
                return None
            if step.kind == "skip":
                self.record(key, r, step, "")
                continue
            if time.monotonic() > until:
                return 0.0
            wait = self.slot(r.channel, r.chat)
            if wait:
                return wait
            try:
                done, again = self.held(job_id, lock, token, r)
            finally:
                self.free_after(r.channel, r.chat)
            if done:
                return again

    def held(self, job_id: str, lock: str, token: str, was: Record) -> tuple[bool, float | None]:
        """With the chat held: the request for the newest version (read again: more may
        have come while it waited). Whether this task is done, and the countdown for a
        new one."""
        key = keys.chat_preview(job_id)
        self.redis.eval(EXTEND, 1, lock, token, self.lock_ms(was.channel))
        if was.final:
            due = time.time() + self.settings.chat_preview_retry_s
            self.redis.zadd(keys.CHAT_FINALS_DUE, {job_id: due}, xx=True)
        r = Record.read(self.redis, job_id)
        step = next_step(r, self.limit) if r is not None else None
        if r is None or step is None or step.kind == "skip":
            return False, None
        backoff = self.request(key, job_id, r, step)
        if backoff is not None:
            return True, backoff
        if r.final:
            return False, None
        # one preview request a task: the next wake-up brings the next version
        newer = Record.read(self.redis, job_id)
        if newer is not None and next_step(newer, self.limit) is not None:
            return True, self.interval_s(r.channel)
        return True, None

    def slot(self, name: str, chat: str) -> float:
        """Waits for the chat to be free and holds it for one request: 0, or when it is
        still busy after two intervals (other jobs of the chat first), the countdown for
        a new try."""
        interval, key = self.interval_s(name), keys.chat_slot(name, chat)
        hold_ms = int(self.request_s() * 1000)
        until = time.monotonic() + 2 * interval
        while ms := int(self.redis.eval(SLOT, 1, key, hold_ms)):
            left = until - time.monotonic()
            if left <= 0:
                return interval
            time.sleep(min(ms / 1000, left, POLL_S))
        return 0.0

    def free_after(self, name: str, chat: str) -> None:
        ms = int(self.interval_s(name) * 1000)
        self.redis.eval(FREE_AFTER, 1, keys.chat_slot(name, chat), ms)

    def request(self, key: str, job_id: str, r: Record, step: Step) -> float | None:
        """One request to the provider, recorded; a failure is logged (redacted by the
        channel) and never raised. The backoff before the final is tried again, or None."""
        chan = channel(r.channel, self.settings)
        claim = "preview" if step.part < 0 else str(step.part)
        message_id = ""
        try:
            if step.kind == "send":
                self.redis.hset(key, "sending", claim)  # before the provider may have it
                delivery = delivery_id(f"preview:{job_id}:{claim}")
                message_id = chan.send(Outgoing(r.chat, step.text, delivery))
            else:
                chan.edit(r.chat, r.message, step.text)
        except ChannelError as exc:
            if NOT_MODIFIED not in str(exc):
                return self.failed(key, job_id, r, step, exc)
        except Exception as exc:  # a provider's surprise: a failure whose send may have gone
            said = chan.redact(f"{type(exc).__name__}: {exc}")
            return self.failed(key, job_id, r, step, ChannelError(said, sent_maybe=True))
        self.record(key, r, step, message_id)
        return None

    def record(self, key: str, r: Record, step: Step, message_id: str) -> None:
        fields: dict[Any, Any] = {"sending": ""}
        if step.part < 0:
            fields |= {"applied": r.version, "shown": step.text}
        else:
            fields |= {"sent": step.part + 1}
            if step.part == 0 and step.kind != "send":
                fields["shown"] = step.text
        if message_id and step.part < 0:
            fields["message"] = message_id
        self.redis.hset(key, mapping=fields)

    def failed(
        self, key: str, job_id: str, r: Record, step: Step, exc: ChannelError
    ) -> float | None:
        what = "final" if r.final else "preview"
        log.warning("job %s: the chat's %s not written: %s", job_id, what, exc)
        maybe = step.kind == "send" and exc.sent_maybe
        if not r.final:  # this version is skipped; a later one tries again
            fields: dict[Any, Any] = {"sending": "", "applied": r.version}
            if maybe:
                fields["lost"] = 1  # it may be in the chat: the final comes as new messages
            self.redis.hset(key, mapping=fields)
            return None
        if maybe:  # it may be in the chat: never sent twice
            self.redis.hset(key, mapping={"sending": "", "sent": step.part + 1})
            return 0.0
        tries = r.tries + 1
        self.redis.hset(key, mapping={"sending": "", "tries": tries})
        if tries >= self.settings.chat_preview_final_attempts:
            self.finished(key, job_id, f"given up after {tries} failed requests")
            return None
        return min(self.settings.chat_preview_retry_s, self.interval_s(r.channel) * 2.0**tries)

    def recover(self, key: str, job_id: str, r: Record) -> None:
        """A send begun and never recorded: its process died, or its answer was lost. The
        provider may have it, so it is not sent again."""
        if not r.sending:
            return
        log.warning("job %s: a chat send (%s) may or may not have arrived", job_id, r.sending)
        if r.sending == "preview":
            self.redis.hset(key, mapping={"sending": "", "lost": 1})
            r.lost = True
        else:
            r.sent = int(r.sending) + 1
            self.redis.hset(key, mapping={"sending": "", "sent": r.sent})
        r.sending = ""

    def finished(self, key: str, job_id: str, why: str) -> None:
        self.redis.hset(key, "done", 1)
        self.redis.zrem(keys.CHAT_FINALS_DUE, job_id)
        if why:
            log.warning("job %s: its final answer is not in the chat: %s", job_id, why)


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class FinalsSweeper(threading.Thread):
    """Wakes the task again for finals not yet written: a lost wake-up, a process that
    died, a provider's failure. One per messaging worker process."""

    def __init__(
        self, settings: Callable[[], Settings], client: redis.Redis, send: Callable[[str], None]
    ) -> None:
        super().__init__(name="chat-finals-sweeper", daemon=True)
        self.settings = settings
        self.redis = client
        self.send = send
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(min(5.0, self.settings().chat_preview_retry_s / 2)):
            try:
                self.sweep()
            except Exception as exc:
                log.warning("chat finals sweep failed: %s", exc)

    def sweep(self) -> None:
        now = time.time()
        again = now + self.settings().chat_preview_retry_s
        for job in self.redis.eval(CLAIM_DUE, 1, keys.CHAT_FINALS_DUE, now, again):
            self.send(_str(job))
