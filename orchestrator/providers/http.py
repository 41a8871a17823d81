"""One streaming POST, shared by the HTTP providers: its failures sorted into those another
try may not have (`ModelUnavailable`: 408, 409, 429, 5xx, 529, a timeout, a refused
connection; failover retries them), a request too long for the model (`ContextOverflow`:
the job compacts and asks again) and the rest (`ModelError`: the job fails)."""

from __future__ import annotations

import email.utils
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from httpx_sse import EventSource, SSEError, aconnect_sse

from orchestrator.providers.base import ContextOverflow, ModelError, ModelUnavailable

RETRYABLE_STATUS = {408, 409, 429, 500, 502, 503, 504, 529}
OVERFLOW = re.compile(
    r"context_length_exceeded|maximum context length|prompt is too long|context window"
    r"|too many (input )?tokens",
    re.IGNORECASE,
)


def model_client(timeout_s: float, connections: int) -> httpx.AsyncClient:
    """An orchestrator's one client for its model requests, holding up to `connections`
    open and alive: httpx's default pool (100, 20 kept) makes the jobs past the 100th
    queue, and its pool scans that queue against the connections on every request."""
    return httpx.AsyncClient(
        timeout=timeout_s,
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )


def retry_after(response: httpx.Response) -> float | None:
    """Seconds the server asks us to wait (`retry-after-ms`, `retry-after` in seconds or
    as an HTTP date), or None."""
    headers = response.headers
    if ms := headers.get("retry-after-ms"):
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        when = email.utils.parsedate_to_datetime(value) if value else None
        return max(0.0, when.timestamp() - time.time()) if when else None


@asynccontextmanager
async def stream_events(
    http: httpx.AsyncClient,
    provider: str,
    url: str,
    headers: dict[str, str],
    body: dict[str, Any],
    timeout: float,
) -> AsyncIterator[EventSource]:
    """An open SSE stream, once; failover (failover.py) decides what is tried again."""
    try:
        async with aconnect_sse(
            http, "POST", url, headers=headers, json=body, timeout=timeout
        ) as source:
            response = source.response
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")[:500]
                error = f"{provider} returned HTTP {response.status_code}: {detail}"
                if response.status_code in RETRYABLE_STATUS:
                    raise ModelUnavailable(error, response.status_code, retry_after(response))
                if response.status_code in (400, 413) and OVERFLOW.search(detail):
                    raise ContextOverflow(error)
                raise ModelError(error)
            try:
                yield source
            except SSEError as exc:  # not a stream at all (a JSON body, an HTML page)
                raise ModelError(f"{provider} stream broke: {exc!r}") from exc
            except httpx.TransportError as exc:  # mid-stream (a timeout, a broken connection)
                raise ModelUnavailable(
                    f"{provider} stream broke: {exc!r}", mid_stream=True
                ) from exc
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                raise ModelError(f"{provider} sent a malformed stream: {exc!r}") from exc
    except httpx.TimeoutException as exc:  # before the stream: no answer in time
        raise ModelUnavailable(
            f"{provider} did not answer within {timeout:g}s ({type(exc).__name__})"
        ) from exc
    except httpx.TransportError as exc:  # before the stream: unreachable
        raise ModelUnavailable(f"{provider} unreachable: {type(exc).__name__}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise ModelError(f"{provider}: {exc}") from exc


def parse_arguments(raw: str) -> tuple[dict[str, Any], str | None]:
    """Tool arguments as a dict, or ({}, raw) when they are not a JSON object."""
    if not raw.strip():
        return {}, None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return {}, raw
    return (value, None) if isinstance(value, dict) else ({}, raw)
