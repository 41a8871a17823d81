"""A local forward proxy that applies the egress policy at connect time, for clients that
resolve names themselves (Chromium): every CONNECT and every plain-HTTP request is
resolved here, every address checked (`netguard`), and the connection made to the
checked address, so DNS rebinding cannot reach what the policy forbids.

It listens on 127.0.0.1 only, on the event loop of whoever starts it. The policy is asked
for at each connection, so a live change reaches pages that are already open; a policy of
None refuses everything (a render that may reach nothing)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from workers.egress.client import Resolver, checked_addresses, system_resolver
from workers.egress.netguard import EgressError, EgressPolicy

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 64 * 1024


class EgressProxy:
    """`start()` on a running loop; `url` is what a browser context's proxy setting takes.
    `on_block(host, reason)` hears every refusal."""

    def __init__(
        self,
        policy: EgressPolicy | Callable[[], EgressPolicy | None],
        on_block: Callable[[str, str], None] | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self.policy = policy if callable(policy) else lambda: policy
        self.on_block = on_block or (lambda host, reason: None)
        self.resolver = resolver or system_resolver
        self.server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        try:
            await self._forward(head, reader, writer)
        except Exception as exc:  # one client's failure never stops the proxy
            log.debug("egress proxy: %s", exc)
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _forward(
        self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        request_line, _, rest = head.partition(b"\r\n")
        try:
            method, target, version = request_line.decode("latin-1").split(" ", 2)
        except ValueError:
            writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            return
        if method == "CONNECT":
            host, _, port_text = target.rpartition(":")
            port = int(port_text or 443)
            tail = b""
        else:
            from urllib.parse import urlsplit

            parts = urlsplit(target)
            if parts.scheme != "http" or not parts.hostname:
                writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                return
            host, port = parts.hostname, parts.port or 80
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            tail = f"{method} {path} {version}\r\n".encode("latin-1") + _one_request(rest)
        host = host.strip("[]")
        try:  # resolved and checked as web_fetch does, off the loop (getaddrinfo blocks)
            policy = self.policy()  # the one in force now, not when the page opened
            if policy is None:
                raise EgressError("url_not_allowed", "no network here")
            found = await asyncio.to_thread(checked_addresses, host, port, policy, self.resolver)
            address = found[0]
        except EgressError as exc:
            self.on_block(host, exc.reason)
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return
        up_reader, up_writer = await asyncio.open_connection(address, port)
        if method == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            await writer.drain()
        else:
            up_writer.write(tail)
            await up_writer.drain()
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


HOP_BY_HOP = (b"connection:", b"proxy-connection:", b"keep-alive:", b"proxy-authorization:")


def _one_request(headers: bytes) -> bytes:
    """The headers with `Connection: close`: a plain-HTTP connection through the proxy
    carries one request, so a second one to another host is checked on its own."""
    lines = [
        line for line in headers.split(b"\r\n") if line and not line.lower().startswith(HOP_BY_HOP)
    ]
    return b"\r\n".join([*lines, b"Connection: close", b"", b""])


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(Exception):
            dst.close()
