"""The one HTTP client of every tool that talks to the outside (DESIGN: egress).

httpx on a connection pool whose network backend resolves the host itself, checks every
A/AAAA answer (`workers.egress.netguard`), and connects to a checked address: the address that
was checked is the one connected to, so DNS rebinding has no window. SNI and the Host
header stay those of the URL (httpcore starts TLS with the URL's host). Redirects are
followed here, at most `CLAWQ_WEB_MAX_REDIRECTS`, each hop checked again; a cross-origin
hop drops `Authorization` and `Cookie`. The body is read decompressed up to a cap, each
step of inflating bounded (`workers.egress.inflate`), so a gzip bomb costs the cap, not its
ratio. `trust_env` is off: no environment proxy applies by accident; `CLAWQ_WEB_PROXY`
sends everything through one (then the names and literal addresses are
checked here, and what the proxy resolves is the proxy's to guard).
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from broker.config.settings import Settings
from workers.egress.inflate import ACCEPT_ENCODING, STEP, decoded, decoder
from workers.egress.netguard import (
    EgressError,
    EgressPolicy,
    check_address,
    check_host,
    check_url,
    parse_url,
)

Resolver = Callable[[str, int], list[str]]
REDIRECTS = frozenset({301, 302, 303, 307, 308})
DROPPED_ACROSS_ORIGINS = ("authorization", "cookie", "proxy-authorization")
USER_AGENT = "clawq/0.1 (+https://github.com/clawq; agent tool web_fetch)"


def system_resolver(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for host:port (A and AAAA)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise EgressError(
            "url_not_accessible", f"{host} does not resolve ({exc.strerror})"
        ) from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def checked_addresses(
    host: str, port: int, policy: EgressPolicy, resolver: Resolver = system_resolver
) -> list[str]:
    """The checked addresses of host:port; any blocked answer refuses them all."""
    literal = check_host(host, policy)
    if literal is not None:
        check_address(literal, port, policy)
        return [str(literal)]
    found = resolver(host, port)
    if not found:
        raise EgressError("url_not_accessible", f"{host} has no address")
    for raw in found:
        check_address(ipaddress.ip_address(raw.split("%", 1)[0]), port, policy, host)
    return found


class GuardedBackend(httpcore.NetworkBackend):
    """httpcore's sync backend, connecting only to addresses the policy allows."""

    def __init__(self, policy: EgressPolicy, resolver: Resolver) -> None:
        self.policy = policy
        self.resolver = resolver
        self.inner = httpcore.SyncBackend()

    def addresses(self, host: str, port: int) -> list[str]:
        return checked_addresses(host, port, self.policy, self.resolver)

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        failure: Exception | None = None
        for address in self.addresses(host, port):
            try:
                return self.inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise EgressError("url_not_allowed", "unix sockets are not reachable")

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


@dataclass
class Fetched:
    """A response read up to the cap: the final URL, status, headers and body."""

    url: str
    status: int
    headers: httpx.Headers
    body: bytes
    truncated: bool
    redirects: int

    @property
    def content_type(self) -> str:
        return str(self.headers.get("content-type", "")).split(";", 1)[0].strip().lower()

    @property
    def charset(self) -> str | None:
        for part in str(self.headers.get("content-type", "")).split(";")[1:]:
            key, _, value = part.strip().partition("=")
            if key.lower() == "charset" and value:
                return value.strip("\"'")
        return None


class Egress:
    """Guarded HTTP for one process (thread-safe, pooled): `request` checks, follows
    redirects and caps the body; every refusal is an `EgressError` with its code."""

    def __init__(self, policy: EgressPolicy, resolver: Resolver | None = None) -> None:
        self.policy = policy
        self.resolver = resolver or system_resolver
        timeout = httpx.Timeout(
            policy.read_timeout_s, connect=policy.connect_timeout_s, pool=policy.connect_timeout_s
        )
        if policy.proxy:
            transport = httpx.HTTPTransport(proxy=policy.proxy, retries=0)
        else:
            transport = httpx.HTTPTransport(retries=0)
            # httpx 0.28 takes no network backend: give its transport a pool that has ours
            transport._pool = httpcore.ConnectionPool(
                ssl_context=ssl.create_default_context(),
                max_connections=1000,
                max_keepalive_connections=20,
                keepalive_expiry=5.0,
                network_backend=GuardedBackend(policy, self.resolver),
            )
        self.client = httpx.Client(
            transport=transport,
            trust_env=False,
            follow_redirects=False,
            timeout=timeout,
            headers={"User-Agent": USER_AGENT, "Accept-Encoding": ACCEPT_ENCODING},
        )

    def close(self) -> None:
        self.client.close()

    def check(self, url: httpx.URL) -> None:
        """Before each hop: the URL itself, and behind a proxy the addresses of its host."""
        check_url(url, self.policy)
        if self.policy.proxy:  # the proxy connects, not us: check the names' addresses here
            GuardedBackend(self.policy, self.resolver).addresses(url.host, url.port or _port(url))

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        max_bytes: int | None = None,
        **kwargs: Any,
    ) -> Fetched:
        """One request, its redirects followed and checked; the body read up to the cap."""
        target = parse_url(url)
        sent = dict(headers or {})
        seen: set[str] = set()
        cap = max_bytes or self.policy.max_body_bytes
        for hop in range(self.policy.max_redirects + 1):
            self.check(target)
            seen.add(str(target))
            try:
                response = self.client.send(
                    self.client.build_request(method, target, headers=sent, **kwargs), stream=True
                )
            except EgressError:
                raise
            except httpx.TimeoutException as exc:
                raise EgressError(
                    "url_not_accessible", f"{target.host} timed out ({_kind(exc)})"
                ) from None
            except httpx.RemoteProtocolError as exc:
                if "location header" in str(exc):  # httpx parses it even when not following
                    raise EgressError(
                        "url_not_allowed", f"a redirect to a bad address: {exc}"
                    ) from None
                raise EgressError("url_not_accessible", f"{target.host}: {exc}") from None
            except httpx.HTTPError as exc:
                raise EgressError("url_not_accessible", f"{target.host}: {exc}") from None
            try:
                if response.status_code in REDIRECTS and "location" in response.headers:
                    following = target.join(response.headers["location"])
                    if hop == self.policy.max_redirects:
                        raise EgressError(
                            "url_not_accessible",
                            f"more than {self.policy.max_redirects} redirects",
                        )
                    if str(following) in seen:
                        raise EgressError("url_not_accessible", f"a redirect loop at {following}")
                    if _origin(following) != _origin(target):
                        sent = {
                            k: v for k, v in sent.items() if k.lower() not in DROPPED_ACROSS_ORIGINS
                        }
                    if response.status_code == 303 or (
                        response.status_code in (301, 302) and method.upper() == "POST"
                    ):
                        method, kwargs = "GET", {}
                    target = following
                    continue
                body, truncated = _read_capped(response, cap)
            finally:
                response.close()
            if response.status_code == 429:
                raise EgressError(
                    "too_many_requests", f"{target.host} answered 429 Too Many Requests"
                )
            return Fetched(
                str(target), response.status_code, response.headers, body, truncated, hop
            )
        raise AssertionError("unreachable")


def _read_capped(response: httpx.Response, cap: int) -> tuple[bytes, bool]:
    """The body decoded up to `cap`, and whether there was more: raw bytes are inflated a
    bounded step at a time (`workers.egress.inflate`), so a bomb costs the cap, not its ratio."""
    data = bytearray()
    inflater = decoder(response.headers.get("content-encoding", ""))
    try:
        for chunk in decoded(response.iter_raw(STEP), inflater):
            room = cap - len(data)
            data += chunk[:room]
            if len(chunk) > room:
                return bytes(data), True
    except httpx.TimeoutException as exc:
        raise EgressError(
            "url_not_accessible", f"reading the body timed out ({_kind(exc)})"
        ) from None
    except httpx.HTTPError as exc:
        raise EgressError("url_not_accessible", f"reading the body failed: {exc}") from None
    return bytes(data), False


def _port(url: httpx.URL) -> int:
    return 443 if url.scheme == "https" else 80


def _origin(url: httpx.URL) -> tuple[str, str, int]:
    return url.scheme, url.host, url.port or _port(url)


def _kind(exc: Exception) -> str:
    return type(exc).__name__.replace("Timeout", " timeout").strip().lower()


_clients: dict[tuple[EgressPolicy, int], Egress] = {}
_lock = threading.Lock()


def egress_for(settings: Settings) -> Egress:
    """This process's client for these settings' policy (made once, shared by threads)."""
    import os

    policy = EgressPolicy.from_settings(settings)
    key = (policy, os.getpid())
    with _lock:
        if key not in _clients:
            _clients[key] = Egress(policy)
        return _clients[key]
