"""A running command's output as `tool_output_delta` events of its job, while it runs.

The pipe readers hand over each chunk they read; a sender thread coalesces them (one event
per stream every `stream_delta_interval_ms`, or sooner once `stream_delta_max_chars` wait)
and appends them to the job's event stream, one round trip per batch. A call sends at most
`tool_output_stream_max_bytes`; past that, one last delta says `truncated` and the rest
shows only in the result (itself capped). Each delta has its stream (`stdout`, `stderr`)
and where its text starts in it (`offset`, in characters). What a Redis error loses is
logged, never the call's failure: the result carries the output either way.

Secrets never leave the worker this way either: only whole lines are sent (a line still
being written waits, up to `HOLD_MAX_CHARS`, or the end), a PEM block waits for its end
line, and what is sent passes the worker's scrubber, with the call's own secrets (a custom
tool's env), as its result does.
"""

from __future__ import annotations

import codecs
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from broker.protocol import Event
from broker.redis import events

log = logging.getLogger("clawq.exec")
HOLD_MAX_CHARS = 16_384  # a line longer than this is sent unended (a progress bar's \r)
PEM_START = "-----BEGIN"
PEM_END = "-----END"


class LiveOutput:
    def __init__(
        self,
        client: redis.Redis,
        job_id: str,
        call_id: str,
        name: str,
        settings: Any,
        scrub: Callable[[str], str],
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.scrub = scrub
        self.extra = extra or {}  # more data for every delta (a background process's id)
        self.client = client
        self.job_id = job_id
        self.call_id = call_id
        self.name = name
        self.interval_s = settings.stream_delta_interval_ms / 1000
        self.max_chars = settings.stream_delta_max_chars
        self.left = settings.tool_output_stream_max_bytes  # bytes this call may still send
        self.ttl_s = settings.events_ttl_s
        self.decoders = {s: codecs.getincrementaldecoder("utf-8")("replace") for s in STREAMS}
        self.waiting: dict[str, list[str]] = {s: [] for s in STREAMS}
        self.held = dict.fromkeys(STREAMS, "")  # read, not sent yet: its line has not ended
        self.offsets = dict.fromkeys(STREAMS, 0)
        self.truncated = False
        self.closed = False
        self.since = 0.0  # when the first waiting chunk came
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._send_loop, daemon=True, name="live-output")
        self.thread.start()

    def chunk(self, stream: str, data: bytes) -> None:
        """A piece of `stream` just read (from a reader thread)."""
        with self.cond:
            if self.truncated or self.closed:
                return
            if len(data) > self.left:
                data, self.truncated = data[: self.left], True
            self.left -= len(data)
            text = self.decoders[stream].decode(data, final=self.truncated)
            if not text and not self.truncated:
                return
            if not any(self.waiting.values()):
                self.since = time.monotonic()
            self.waiting[stream].append(text)
            self.cond.notify()

    def close(self) -> None:
        """The command ended: what waits goes now; returns once it is sent."""
        with self.cond:
            self.closed = True
            self.cond.notify()
        self.thread.join(timeout=5)

    def _send_loop(self) -> None:
        sent_truncated = False
        while True:
            with self.cond:
                while not self.closed and not self._due():
                    wait = None
                    if any(self.waiting.values()):
                        wait = max(0.0, self.since + self.interval_s - time.monotonic())
                    self.cond.wait(wait)
                closing = self.closed
                batch = self._take(closing or self.truncated)
                if self.truncated and not sent_truncated:
                    batch.append(self._event("stdout", "", truncated=True))
                    sent_truncated = True
            if batch:
                self._send(batch)
            if closing:
                return

    def _due(self) -> bool:
        waiting = sum(len(t) for parts in self.waiting.values() for t in parts)
        if waiting >= self.max_chars or (self.truncated and waiting):
            return True
        return bool(waiting) and time.monotonic() - self.since >= self.interval_s

    def _take(self, last: bool) -> list[Event]:
        batch = []
        for stream, parts in self.waiting.items():
            text = self.held[stream] + "".join(parts)
            self.waiting[stream] = []
            cut = len(text) if last else _whole(text)
            self.held[stream] = text[cut:]
            if cut:
                batch.append(self._event(stream, self.scrub(text[:cut])))
        return batch

    def _event(self, stream: str, text: str, truncated: bool = False) -> Event:
        data: dict[str, Any] = {
            "call_id": self.call_id,
            "name": self.name,
            **self.extra,
            "stream": stream,
            "offset": self.offsets[stream],
            "text": text,
        }
        if truncated:
            data["truncated"] = True
        self.offsets[stream] += len(text)
        return Event(type="tool_output_delta", job_id=self.job_id, data=data)

    def _send(self, batch: list[Event]) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            events.add(pipe, batch, self.ttl_s)
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("job %s: %d output deltas not sent: %s", self.job_id, len(batch), exc)


STREAMS = ("stdout", "stderr")


def _whole(text: str) -> int:
    """How much of `text` may go now: its whole lines, before any unended PEM block."""
    cut = text.rfind("\n") + 1
    if not cut and len(text) > HOLD_MAX_CHARS:
        cut = len(text)
    begin = text.rfind(PEM_START, 0, cut)
    if begin >= 0 and text.find(PEM_END, begin) < 0:
        cut = begin
    return cut


def live_output(ctx: Any, name: str, secrets: list[str]) -> LiveOutput | None:
    """The call's live output, when it has a job to tell and the settings allow it."""
    if ctx.redis is None or not ctx.job_id or ctx.settings.tool_output_stream_max_bytes <= 0:
        return None
    from workers.scrub import Scrubber

    scrub = ctx.scrub.extended(secrets) if ctx.scrub is not None else Scrubber(secrets)
    return LiveOutput(ctx.redis, ctx.job_id, ctx.call_id, name, ctx.settings, scrub)
