"""A real local HTTP server speaking the OpenAI chat completions and Anthropic messages
wire, whose every answer a test decides (by the key that asked, the body, a count): for
failover (429 with retry-after, 529, 500, a slow answer) and context limits."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.orchestrator.conftest import openai_chunk, sse


@dataclass
class Asked:
    path: str
    headers: dict[str, str]  # names lower-cased
    body: Any
    at: float = field(default_factory=time.monotonic)

    @property
    def key(self) -> str:
        """The API key the request carried (either wire)."""
        bearer = self.headers.get("authorization", "")
        return bearer.removeprefix("Bearer ") if bearer else self.headers.get("x-api-key", "")

    @property
    def wire(self) -> str:
        return "anthropic" if self.path.endswith("/messages") else "openai"


@dataclass
class Answer:
    status: int
    body: str
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # before the headers (a server that does not answer in time)
    content_type: str = "text/event-stream"
    # after `body`, streamed: (seconds to wait first, a piece of the body); the server
    # notes when it sent each (`WireServer.sent`)
    pieces: list[tuple[float, str]] = field(default_factory=list)


def error(status: int, message: str, **headers: str) -> Answer:
    body = json.dumps({"type": "error", "error": {"type": "api_error", "message": message}})
    return Answer(
        status, body, {k.replace("_", "-"): v for k, v in headers.items()}, 0.0, "application/json"
    )


def text(asked: Asked, said: str, usage: tuple[int, int] = (10, 5)) -> Answer:
    """A text-only reply in the wire the request used."""
    if asked.wire == "openai":
        body = sse(
            (None, openai_chunk({"role": "assistant", "content": said})),
            (None, openai_chunk({}, "stop")),
            (
                None,
                {
                    "choices": [],
                    "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]},
                },
            ),
            done=True,
        )
        return Answer(200, body)
    start = {
        "type": "message_start",
        "message": {
            "id": "msg",
            "type": "message",
            "role": "assistant",
            "model": "m",
            "content": [],
            "usage": {"input_tokens": usage[0], "output_tokens": 1},
        },
    }
    body = sse(
        ("message_start", start),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": said},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": usage[1]},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    )
    return Answer(200, body)


def openai_call(call_id: str, name: str, args: dict[str, Any], usage: tuple[int, int]) -> Answer:
    call = {
        "index": 0,
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }
    body = sse(
        (None, openai_chunk({"role": "assistant", "tool_calls": [call]})),
        (None, openai_chunk({}, "tool_calls")),
        (
            None,
            {"choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}},
        ),
        done=True,
    )
    return Answer(200, body)


def streamed(asked: Asked, words: list[str], delay_s: float, break_after: int = -1) -> Answer:
    """A text reply in the request's wire, one SSE event per word, `delay_s` apart; with
    `break_after` (Anthropic's wire), an overload error event after that many words."""
    if asked.wire == "openai":
        head = sse((None, openai_chunk({"role": "assistant", "content": ""})))
        usage = {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}
        tail = sse((None, openai_chunk({}, "stop")), (None, usage), done=True)
        pieces = [(delay_s, sse((None, openai_chunk({"content": w})))) for w in words]
        return Answer(200, head, pieces=[*pieces, (0.0, tail)])
    whole = text(asked, "")  # its text block's one delta is left out: the words replace it
    head, _, rest = whole.body.partition("event: content_block_delta")
    tail = rest.partition("\n\n")[2]
    pieces = [
        (
            delay_s,
            sse(
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": w},
                    },
                )
            ),
        )
        for w in words
    ]
    if break_after >= 0:
        busy = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
        return Answer(200, head, pieces=[*pieces[:break_after], (delay_s, sse(("error", busy)))])
    return Answer(200, head, pieces=[*pieces, (0.0, tail)])


class WireServer:
    def __init__(self, answer: Callable[[Asked], Answer]) -> None:
        self.answer = answer
        self.asked: list[Asked] = []
        self.sent: list[tuple[float, str]] = []  # (time.time(), piece) of streamed pieces
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.port: int = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def keys(self, since: int = 0) -> list[str]:
        with self.lock:
            return [a.key for a in self.asked[since:]]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                asked = Asked(
                    self.path, {k.lower(): v for k, v in self.headers.items()}, json.loads(raw)
                )
                with server.lock:
                    server.asked.append(asked)
                try:
                    answer = server.answer(asked)
                except Exception as exc:  # a bug of the test's answer: said, not hung
                    answer = Answer(
                        501, json.dumps({"error": repr(exc)}), {}, 0.0, "application/json"
                    )
                time.sleep(answer.delay_s)
                body = answer.body.encode()
                try:
                    self.send_response(answer.status)
                    self.send_header("Content-Type", answer.content_type)
                    if not answer.pieces:  # else the body ends as the connection closes
                        self.send_header("Content-Length", str(len(body)))
                    self.send_header("Connection", "close")
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(body)
                    for wait, piece in answer.pieces:
                        self.wfile.flush()
                        time.sleep(wait)
                        self.wfile.write(piece.encode())
                        self.wfile.flush()
                        with server.lock:
                            server.sent.append((time.time(), piece))
                except OSError:  # the client gave up waiting (a timeout test)
                    pass
                self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def __enter__(self) -> WireServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
