"""Heartbeats: each live process keeps a short-lived key, so death is seen in seconds.

Celery's own answer to a dead consumer is the visibility timeout (an hour by default);
agent work needs to know within seconds, so every executing process and orchestrator
refreshes `clawq:proc:<id>` and anyone can check whether an owner is still alive.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.client import Pipeline

from broker import keys

log = logging.getLogger("clawq.presence")


def queues_of(proc: dict[str, Any]) -> list[str]:
    """The queues a worker process consumes: one group's, or several light groups'."""
    return [str(q) for q in proc.get("queues") or [proc.get("queue")]]


def process_id(kind: str, node: str | None = None) -> str:
    """Node and pid identify the process that ran something (reported to users)."""
    return f"{kind}@{node or socket.gethostname()}:{os.getpid()}"


class Heartbeat:
    """A daemon thread that keeps this process's presence key alive.

    `extra` adds commands to each beat's round trip (an orchestrator's job leases);
    `alive`, when it says no, skips the beat, so the key lapses as a dead process's does;
    `state` adds fields to each beat (a worker's `calls`: those it holds now). Each beat
    says when it was made (`at`, this host's clock): a watchdog compares it with when a
    call began on the same host."""

    def __init__(
        self,
        client: redis.Redis,
        proc_id: str,
        info: dict[str, Any],
        interval_s: float,
        ttl_s: float,
        node: str | None = None,
        also: tuple[str, ...] = (),
        extra: Callable[[Pipeline], None] | None = None,
        alive: Callable[[], bool] | None = None,
        state: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        # its own connections, with a timeout: a beat stuck behind a slow read would let
        # the key expire while the process is alive
        pool = client.connection_pool
        kwargs = {**pool.connection_kwargs}
        kwargs["socket_timeout"] = kwargs["socket_connect_timeout"] = max(1.0, ttl_s / 4)
        self.client = redis.Redis(
            connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)
        )
        self.proc_id = proc_id
        self.info = {
            **info,
            "host": node or socket.gethostname(),
            "pid": os.getpid(),
            "id": proc_id,
            "started": time.time(),
        }
        self.also = also  # keys kept alive with this one, shared with others: never deleted
        self.extra, self.alive, self.state = extra, alive, state
        self.interval_s = interval_s
        self.ttl_ms = int(ttl_s * 1000)
        self.stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clawq-heartbeat", daemon=True)

    def start(self) -> None:
        try:
            self.beat()
        except Exception as exc:  # Redis away as the process starts: the thread beats on
            log.warning("first heartbeat of %s failed (%s); retrying", self.proc_id, exc)
        self._thread.start()

    def beat(self) -> None:
        self.info["load"] = round(os.getloadavg()[0], 2)
        self.info["at"] = time.time()
        info = self.info if self.state is None else {**self.info, **self.state()}
        pipe = self.client.pipeline(transaction=False)
        pipe.set(keys.proc(self.proc_id), json.dumps(info), px=self.ttl_ms)
        for key in self.also:
            pipe.set(key, self.proc_id, px=self.ttl_ms)
        if self.extra is not None:
            self.extra(pipe)
        pipe.execute()

    def stop(self) -> None:
        self.stopped.set()
        if self._thread.is_alive():  # a beat in flight would set the key again
            self._thread.join(timeout=5)
        self.client.delete(keys.proc(self.proc_id))
        self.client.connection_pool.disconnect()  # its own pool (close() leaves a given one)

    def _run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            if self.alive is not None and not self.alive():
                continue
            try:
                self.beat()
            except Exception as exc:  # never let the thread die: a silent heartbeat reads
                # as a dead process, and its calls would be run a second time elsewhere
                log.warning("heartbeat of %s failed (%s); retrying", self.proc_id, exc)


STALE_INTERVALS = 2.5  # a beat this many intervals old is a dead process's


def beat_age_s(pttl_ms: int, ttl_s: float) -> float:
    """How long ago a heartbeat key was last set, from its remaining life (no clocks)."""
    return ttl_s - pttl_ms / 1000


def stale(pttl_ms: int, interval_s: float, ttl_s: float) -> bool:
    """A process that died stops beating; its key lives on until the TTL. A beat older
    than STALE_INTERVALS intervals says the process is gone (a missing key says it too)."""
    return pttl_ms < 0 or beat_age_s(pttl_ms, ttl_s) > STALE_INTERVALS * interval_s


def live_processes(client: redis.Redis) -> list[dict[str, Any]]:
    """Every process whose heartbeat is current."""
    found: list[dict[str, Any]] = []
    for key in client.scan_iter(match=keys.PROC_PATTERN, count=500):
        raw = client.get(key)
        if raw:
            found.append(json.loads(raw))
    return found
