"""A real local HTTP server standing in for the model APIs: it records every request and
answers each with the next queued reply (a recorded SSE stream or a JSON error)."""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from broker.config.settings import Settings

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "providers"
HOLD_TIMEOUT_S = 30.0  # above every wait of the tests that hold a stream


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def sse(*events: tuple[str | None, Any], done: bool = False) -> str:
    """An SSE body: (event name or None, data as JSON-able or a raw string); OpenAI ends
    its streams with `data: [DONE]`."""
    out = []
    for name, data in events:
        line = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
        out.append((f"event: {name}\n" if name else "") + f"data: {line}\n\n")
    return "".join(out) + ("data: [DONE]\n\n" if done else "")


def openai_chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1737047321,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def tool_delta(
    index: int, id_: str | None = None, name: str | None = None, arguments: str = ""
) -> dict[str, Any]:
    """A delta with one tool-call piece; the first piece of a call carries id and name."""
    call: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if id_ is not None:
        call.update(id=id_, type="function")
        call["function"] = {"name": name, "arguments": arguments}
    return {"tool_calls": [call]}


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: Any


@dataclass
class Reply:
    status: int
    body: bytes
    content_type: str
    hold_at: int | None = None  # send body[:hold_at], wait for `release`, then the rest
    release: threading.Event = field(default_factory=threading.Event)


class ModelServer:
    """Answers POSTs on any path, in order, with the queued replies."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.replies: deque[Reply] = deque()
        self.queued: list[Reply] = []  # every reply ever queued, to release on stop
        self.holds: list[bool] = []  # per held reply: released before HOLD_TIMEOUT_S
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port: int = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reply_sse(self, text: str, hold_after: str | None = None) -> threading.Event:
        """Queue an SSE stream. With `hold_after`, the server sends the stream up to the end
        of the event containing that text, then waits until the returned event is set."""
        body = text.encode()
        hold_at = None
        if hold_after is not None:
            start = body.index(hold_after.encode())
            hold_at = body.index(b"\n\n", start) + 2
        reply = Reply(200, body, "text/event-stream", hold_at=hold_at)
        self._queue(reply)
        return reply.release

    def reply_fixture(self, name: str, hold_after: str | None = None) -> threading.Event:
        return self.reply_sse(fixture_text(name), hold_after)

    def reply_json(self, status: int, payload: Any) -> None:
        self._queue(Reply(status, json.dumps(payload).encode(), "application/json"))

    def _queue(self, reply: Reply) -> None:
        with self.lock:
            self.replies.append(reply)
            self.queued.append(reply)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw) if raw else None
                except json.JSONDecodeError:
                    body = raw.decode(errors="replace")
                with server.lock:
                    server.requests.append(
                        Recorded(
                            "POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body
                        )
                    )
                    reply = server.replies.popleft() if server.replies else None
                if reply is None:  # 501: not retried by the providers, so a test fails fast
                    reply = Reply(501, b'{"error": "no reply queued"}', "application/json")
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(len(reply.body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                if reply.hold_at is None:
                    self.wfile.write(reply.body)
                    return
                self.wfile.write(reply.body[: reply.hold_at])
                self.wfile.flush()
                released = reply.release.wait(HOLD_TIMEOUT_S)
                with server.lock:
                    server.holds.append(released)
                self.wfile.write(reply.body[reply.hold_at :])

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def start(self) -> None:
        self.thread.start()

    def __enter__(self) -> ModelServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        for reply in self.queued:  # never leave a handler waiting
            reply.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    with ModelServer() as server:
        yield server


@pytest.fixture
def provider_settings(model_server: ModelServer) -> Settings:
    return Settings(
        openai_base_url=f"http://127.0.0.1:{model_server.port}/v1",
        openai_api_key="sk-test",
        openai_model="gpt-4o-mini",
        anthropic_base_url=f"http://127.0.0.1:{model_server.port}",
        anthropic_api_key="test",
        anthropic_model="claude-sonnet-4-5",
        anthropic_max_tokens=1024,
        model_timeout_s=10.0,
    )
