"""Riding out a Redis or PostgreSQL that is away: what must be recorded waits for it.

A worker's outcome, a job's events, its transcript writes: dropping one loses work (a call
left "running" under a live process is run again when that process later dies), so they
are retried with a backoff that tops out at one second, until the service answers or
`outage_retry_s` has passed. Only errors that say the service is unreachable are retried;
a refused command or a bad row fails at once.

Heartbeats lapse while Redis is away, so for a while after Redis comes back a missing
heartbeat says nothing about the process: `heartbeats_trusted` waits until every live
process has had time to beat again.
"""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Callable
from typing import Any

import psycopg
import redis
import redis.asyncio as aioredis
from psycopg_pool import PoolTimeout
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
)

log = logging.getLogger("clawq.outage")

FIRST_WAIT_S = 0.05
LONGEST_WAIT_S = 1.0  # a service that is back is used within a second


def redis_down(exc: BaseException) -> bool:
    """Redis cannot be reached (refused, reset, timed out, no connection free in time)."""
    return isinstance(exc, redis.ConnectionError | redis.TimeoutError | ConnectionError)


def postgres_down(exc: BaseException) -> bool:
    """PostgreSQL cannot be reached, or dropped the connection (a restart, a failover);
    a statement it refused (a constraint, a cancel, bad data) is not an outage."""
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return False
    state = getattr(exc, "sqlstate", None)
    return state is None or state.startswith(("08", "57P"))  # connection; shutdown/starting


def down(exc: BaseException) -> bool:
    return redis_down(exc) or postgres_down(exc)


def _say(what: str) -> Callable[[RetryCallState], None]:
    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if state.attempt_number in (1, 10) or state.attempt_number % 60 == 0:
            log.warning("%s: %s; retrying (attempt %d)", what, exc, state.attempt_number)

    return before_sleep


def retrying(what: str, cap_s: float, when: Callable[[BaseException], bool] = down) -> Retrying:
    """For a blocking `for attempt in retrying(...): with attempt: ...` loop."""
    return Retrying(
        retry=retry_if_exception(when),
        wait=wait_exponential(multiplier=FIRST_WAIT_S, max=LONGEST_WAIT_S),
        stop=stop_after_delay(cap_s),
        before_sleep=_say(what),
        reraise=True,
    )


def async_retrying(
    what: str, cap_s: float, when: Callable[[BaseException], bool] = down
) -> AsyncRetrying:
    return AsyncRetrying(
        retry=retry_if_exception(when),
        wait=wait_exponential(multiplier=FIRST_WAIT_S, max=LONGEST_WAIT_S),
        stop=stop_after_delay(cap_s),
        before_sleep=_say(what),
        reraise=True,
    )


def uptime_s(info: dict[str, Any]) -> float:
    return float(info.get("uptime_in_seconds", 0))


def trust_after_s(interval_s: float, ttl_s: float) -> float:
    """How long Redis must have been up before a missing heartbeat means a dead process:
    a TTL for every key that lapsed meanwhile to be beaten again, and an interval more."""
    return ttl_s + interval_s


async def heartbeats_trusted(client: aioredis.Redis, interval_s: float, ttl_s: float) -> bool:
    """Whether Redis has been up long enough that a missing heartbeat means death."""
    return uptime_s(await client.info("server")) >= trust_after_s(interval_s, ttl_s)


def stale(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether an idle PostgreSQL connection is dead: closed, broken, or readable while
    nothing was asked (the server said goodbye, or the socket is at its end: a restart).
    No round trip: one poll of the socket."""
    if conn.closed or conn.broken:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(readable)


async def check_connection(conn: psycopg.AsyncConnection[Any]) -> None:
    """psycopg_pool's `check`: a dead connection is thrown away at checkout, not used
    (closed here: the pool takes back an open one as good, and would hand it out again)."""
    if stale(conn):
        await conn.close()
        raise psycopg.OperationalError("the connection was closed by the server")


_said: dict[str, float] = {}
SAY_EVERY_S = 10.0


def report(logger: logging.Logger, what: str, exc: BaseException) -> None:
    """A failed round of a background loop: an outage in one line (every few seconds at
    most: the loop goes on and so does the outage), anything else with its traceback."""
    if not down(exc):
        logger.exception("%s failed", what)
        return
    now = time.monotonic()
    if now - _said.get(what, 0.0) >= SAY_EVERY_S:
        _said[what] = now
        logger.warning("%s: service away (%s: %s); retrying", what, type(exc).__name__, exc)
