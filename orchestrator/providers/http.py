"""Streaming POST with retries, shared by the HTTP providers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from httpx_sse import EventSource, aconnect_sse
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from orchestrator.providers.base import ModelError

RETRYABLE_STATUS = {408, 409, 429, 500, 502, 503, 504, 529}


class _Retryable(ModelError):
    pass


def _is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, _Retryable | httpx.TransportError)


@asynccontextmanager
async def stream_events(
    http: httpx.AsyncClient,
    provider: str,
    url: str,
    headers: dict[str, str],
    body: dict[str, Any],
    timeout: float,
) -> AsyncIterator[EventSource]:
    """An open SSE stream; connection failures and retryable statuses are retried first."""
    try:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_is_retryable),
            stop=stop_after_attempt(3),
            wait=wait_exponential(multiplier=0.5, max=8),
            reraise=True,
        ):
            with attempt:
                try:
                    async with aconnect_sse(
                        http, "POST", url, headers=headers, json=body, timeout=timeout
                    ) as source:
                        response = source.response
                        if response.status_code != 200:
                            detail = (await response.aread()).decode(errors="replace")[:500]
                            error = f"{provider} returned HTTP {response.status_code}: {detail}"
                            if response.status_code in RETRYABLE_STATUS:
                                raise _Retryable(error)
                            raise ModelError(error)
                        try:
                            yield source
                        except httpx.TransportError as exc:  # mid-stream: not retried
                            raise ModelError(f"{provider} stream broke: {exc}") from exc
                        except (ValueError, KeyError, TypeError, IndexError) as exc:
                            raise ModelError(
                                f"{provider} sent a malformed stream: {exc!r}"
                            ) from exc
                        return
                except httpx.TransportError:
                    raise
                except httpx.HTTPError as exc:
                    raise ModelError(f"{provider}: {exc}") from exc
    except httpx.TransportError as exc:  # still failing after the retries
        raise ModelError(f"{provider} unreachable: {type(exc).__name__}: {exc}") from exc


def parse_arguments(raw: str) -> tuple[dict[str, Any], str | None]:
    """Tool arguments as a dict, or ({}, raw) when they are not a JSON object."""
    if not raw.strip():
        return {}, None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return {}, raw
    return (value, None) if isinstance(value, dict) else ({}, raw)
