"""What every route of the HTTP API shares: the caller (from an API key), the objects it
owns, and the direct client each worker thread uses. Routes raise `broker.errors`; app.py
answers them.

The API is one more client of the store and the queues (DESIGN): its routes call the same
`orchestrator.client.Client` the Python users call, one per thread of the request pool,
so submitting over HTTP and from Python are one path. Authentication and the per-key
request limit run on the event loop; a route's blocking work runs in the thread pool.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Annotated

import redis.asyncio as aioredis
from fastapi import Depends, Path, Request
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from broker.config.settings import Settings
from broker.errors import Forbidden, NotFound, RateLimited, Unauthorized
from broker.redis.ratelimit import RateLimiter
from broker.stores.api_keys import ApiKey, authenticate
from orchestrator.api.streams import EventHub
from orchestrator.client import LocalClient


@dataclass
class Services:
    """Opened once per API process (the lifespan), shared by every request."""

    settings: Settings
    pool: AsyncConnectionPool
    redis: aioredis.Redis
    limiter: RateLimiter
    local: threading.local
    hub: EventHub

    def client(self) -> LocalClient:
        """This thread's direct client (its own PostgreSQL connection)."""
        client = getattr(self.local, "client", None)
        if client is None:
            client = self.local.client = LocalClient(self.settings)
        return client


def services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Principal:
    key_id: str
    user_id: str
    admin: bool
    agents: tuple[str, ...] = ("main",)

    def may_see(self, owner: str) -> bool:
        return self.admin or owner == self.user_id

    def may_run(self, agent: str) -> bool:
        """The key names the agent (an admin's key runs any)."""
        return self.admin or agent in self.agents


async def principal(request: Request, svc: Annotated[Services, Depends(services)]) -> Principal:
    """The caller: a live key in `Authorization: Bearer`, within its request limit."""
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        raise Unauthorized("send an API key: Authorization: Bearer clawq_…")
    key: ApiKey | None = await authenticate(svc.pool, presented)
    if key is None:
        raise Unauthorized("the API key is wrong or revoked")
    admitted, used = await svc.limiter.admit(f"api:{key.id}")
    if not admitted:
        raise RateLimited(f"{used} requests in the last minute: the key's limit; slow down")
    return Principal(key.id, key.user_id, key.admin, tuple(key.agents))


async def admin(caller: Annotated[Principal, Depends(principal)]) -> Principal:
    if not caller.admin:
        raise Forbidden("this needs an admin key")
    return caller


Caller = Annotated[Principal, Depends(principal)]
Admin = Annotated[Principal, Depends(admin)]
Svc = Annotated[Services, Depends(services)]

Id = Annotated[str, Path(pattern=r"^[^\x00-\x1f\x7f]{1,256}$")]
"""Every path parameter: printable, at most 256 characters. Anything else is no object of
ours, so it is a 404 (app.py maps a path parameter's validation error to it), decided
before a query could fail on it (PostgreSQL refuses a NUL byte)."""


async def owned_session(session_id: Id, caller: Caller, svc: Svc) -> str:
    """The session id if this caller may see it; 404 otherwise. A dependency, so it is
    decided before a response (the canvas's event stream) starts."""
    async with svc.pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute("SELECT user_id FROM sessions WHERE id = %s", (session_id,))
        row = await cur.fetchone()
    if row is None or not caller.may_see(row["user_id"]):
        raise NotFound(f"no session {session_id}")
    return session_id


OwnedSession = Annotated[str, Depends(owned_session)]
