"""The egress client's async form, for the MCP SDK's HTTP transports (streamable HTTP and
SSE take an `httpx2.AsyncClient`): the same guard as `workers.egress.client`, on httpcore2. Its
network backend resolves the host, checks every answer with the policy in force and
connects to a checked address; `trust_env` is off, so no environment proxy applies.
The MCP transports follow redirects themselves, within the server's origin, and every
connection they open meets this backend."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Iterable
from typing import Any

import httpcore2
import httpx2

from workers.egress.client import Resolver, checked_addresses, system_resolver
from workers.egress.netguard import EgressError, EgressPolicy


class AsyncGuardedBackend(httpcore2.AsyncNetworkBackend):
    """httpcore2's anyio backend, connecting only to addresses the policy allows."""

    def __init__(self, policy: Callable[[], EgressPolicy], resolver: Resolver) -> None:
        self.policy = policy
        self.resolver = resolver
        self.inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        found = await asyncio.to_thread(checked_addresses, host, port, self.policy(), self.resolver)
        failure: Exception | None = None
        for address in found:
            try:
                return await self.inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore2.AsyncNetworkStream:
        raise EgressError("url_not_allowed", "unix sockets are not reachable")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def client_factory(
    policy: Callable[[], EgressPolicy], resolver: Resolver | None = None
) -> Callable[..., httpx2.AsyncClient]:
    """An `McpHttpClientFactory` whose clients connect only where `policy()` allows."""

    def make(
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient:
        transport = httpx2.AsyncHTTPTransport(retries=0)
        # like the sync client: httpx2 takes no network backend, its pool does
        transport._pool = httpcore2.AsyncConnectionPool(
            ssl_context=ssl.create_default_context(),
            max_connections=100,
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=AsyncGuardedBackend(policy, resolver or system_resolver),
        )
        kwargs: dict[str, Any] = {"timeout": timeout or httpx2.Timeout(30, read=300)}
        if auth is not None:
            kwargs["auth"] = auth
        return httpx2.AsyncClient(transport=transport, headers=headers, trust_env=False, **kwargs)

    return make
