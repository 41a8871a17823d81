"""The HTTP API (`clawq api`): FastAPI on uvicorn, one more client of the store and the
queues. OpenAPI at /openapi.json, docs at /docs and /redoc (their files served from the
fastapi-offline wheel, so they work offline); every error is one JSON shape with a
stable `code` (a validation error names the field); no CORS unless configured."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException

from broker import outage
from broker.config.settings import Settings
from broker.errors import RequestError, Unavailable
from broker.pg.store import Store, async_pool
from broker.redis.connections import reconnecting_redis
from broker.redis.ratelimit import RateLimiter
from orchestrator.api import (
    artifacts,
    canvas,
    custom_tools,
    fork,
    jobs,
    mcp,
    replay,
    requests,
    requests_chat,
)
from orchestrator.api.deps import Services
from orchestrator.api.streams import EventHub

HTTP_CODES = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}
CONNECTION_WAIT_S = 5.0  # a request waits this long for a PostgreSQL connection, then 503
RETRY_AFTER_S = 5


def answer(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    """Every error's one shape: `{"error": {"code", "message", "field"}}`."""
    error: dict[str, Any] = {"code": code, "message": message}
    if field:
        error["field"] = field
    return JSONResponse({"error": error}, status_code=status)


def retry_later(message: str) -> JSONResponse:
    """A service is away: 503, retryable, with when to try again."""
    body = {"error": {"code": "unavailable", "message": message}, "retryable": True}
    return JSONResponse(body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = Store(settings.database_url)
        store.migrate()
        store.close()
        # a request waits a few seconds at most for a connection (then 503, retryable)
        pool = async_pool(
            settings.database_url, settings.database_pool_size, timeout=CONNECTION_WAIT_S
        )
        await pool.open(wait=True)
        client = reconnecting_redis(settings.redis_url, max_connections=10_000)
        limiter = RateLimiter(client, settings.api_rate_limit_per_minute, window_s=60.0)
        hub = EventHub(client)
        await hub.start()
        app.state.services = Services(settings, pool, client, limiter, threading.local(), hub)
        try:
            yield
        finally:
            await hub.stop()
            await pool.close()
            await client.aclose()

    app = FastAPIOffline(  # /docs and /redoc with their files from the package, not a CDN
        title="clawq",
        version="0.1.0",
        description="Submit agent jobs, follow their events, answer approvals; administer "
        "MCP servers and custom tools. Authenticate with `Authorization: Bearer <API key>`.",
        lifespan=lifespan,
    )
    app.include_router(jobs.router)
    app.include_router(mcp.router)
    app.include_router(mcp.callback)
    app.include_router(custom_tools.router)
    app.include_router(artifacts.router)
    app.include_router(canvas.router)
    app.include_router(requests.router)
    app.include_router(requests_chat.router)
    app.include_router(replay.router)
    app.include_router(fork.router)

    @app.exception_handler(RequestError)
    async def refused(request: Request, exc: RequestError) -> JSONResponse:
        return answer(exc.status, exc.code, exc.message, exc.field)

    @app.exception_handler(Unavailable)
    async def unavailable(request: Request, exc: Unavailable) -> JSONResponse:
        return retry_later(f"{exc}; retry in a few seconds")

    @app.exception_handler(redis.RedisError)
    @app.exception_handler(psycopg.OperationalError)
    async def service_away(request: Request, exc: Exception) -> JSONResponse:
        """Redis or PostgreSQL away: a clear, retryable answer at once, never a hang."""
        if not outage.down(exc):
            return answer(500, "internal", type(exc).__name__)
        which = "redis" if outage.redis_down(exc) else "postgresql"
        return retry_later(f"{which} is unreachable right now; retry in a few seconds")

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors: list[Any] = list(exc.errors())
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        if first["loc"][:1] == ("path",):  # a malformed id names no object: not found
            return answer(404, "not_found", f"no {first['loc'][-1]} like that")
        field = ".".join(str(p) for p in first["loc"] if p not in ("body", "query", "path"))
        message = f"{field}: {first['msg']}" if field else str(first["msg"])
        return answer(422, "invalid_input", message, field or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        return answer(exc.status_code, code, str(exc.detail))

    @app.get("/metrics", tags=["operations"], include_in_schema=False)
    async def prometheus() -> Response:
        """This process's metrics (its Python runtime's), for Prometheus."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, str]:
        """Alive and able to reach Redis."""
        await app.state.services.redis.ping()
        return {"status": "ok"}

    if settings.api_cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.api_cors_origins,
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID"],
        )
    return app
