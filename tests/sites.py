"""Real local HTTP servers for the web tests: routes answer with fixed content, delays,
redirects and encodings, and every request is recorded, so a test can say that a
blocked server was never reached."""

from __future__ import annotations

import contextlib
import gzip
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def form(self) -> dict[str, list[str]]:
        return parse_qs(self.body.decode())


Route = Callable[[Seen], Reply]


class Site:
    """A server on 127.0.0.1 with a free port; `routes` maps a path to a reply (or a
    function of the request that makes one); unknown paths get 404."""

    def __init__(self, routes: dict[str, Reply | Route] | None = None) -> None:
        self.routes: dict[str, Reply | Route] = dict(routes or {})
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.port: int = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> str:
        """This server as a `CLAWQ_WEB_PRIVATE_ALLOW` entry."""
        return f"127.0.0.1:{self.port}"

    def paths(self) -> list[str]:
        with self.lock:
            return [s.path for s in self.seen]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                seen = Seen(
                    self.command,
                    parts.path,
                    parse_qs(parts.query),
                    {k.lower(): v for k, v in self.headers.items()},
                    self.rfile.read(length) if length else b"",
                )
                with site.lock:
                    site.seen.append(seen)
                    route = site.routes.get(parts.path)
                reply = route(seen) if callable(route) else route or Reply(404, b"not found")
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(len(reply.body)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                if self.command != "HEAD":
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        self.wfile.write(reply.body)

            do_GET = do_POST = do_HEAD = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def __enter__(self) -> Site:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def redirect(location: str, status: int = 302) -> Reply:
    return Reply(status, b"", headers={"Location": location})


def gzipped(data: bytes, content_type: str = "text/plain; charset=utf-8") -> Reply:
    return Reply(200, gzip.compress(data, 6), content_type, {"Content-Encoding": "gzip"})


def tiny_pdf(text: str) -> bytes:
    """A valid one-page PDF showing `text` (Helvetica), built by hand: no PDF library
    writes text here."""
    stream = f"BT /F1 24 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += (
        f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    )
    return bytes(out)
