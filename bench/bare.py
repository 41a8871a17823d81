"""The baselines: bare Celery with its Redis result backend, default settings, a no-op task,
served by two workers of one executing process each: the solo pool (the task runs in the
consuming process, as clawq's `direct` pool does: the like-for-like baseline) and Celery's
default prefork pool (`-c 1`: a parent that consumes and a child that executes), each on a
queue of its own so a round trip names the pool it measures."""

from __future__ import annotations

import os
import sys
import time
import uuid

from celery import Celery

url = os.environ["BENCH_REDIS_URL"]
app = Celery("bare", broker=url, backend=url)
app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)

POOLS = ("solo", "prefork")


@app.task(name="bare.noop")
def noop() -> str:
    return "ok"


def worker(pool: str, concurrency: int = 1) -> list[str]:
    """The argv of a bare worker of `pool` consuming `queue(pool)`."""
    argv = [sys.executable, "-m", "celery", "-A", "bench.bare", "worker", "-P", pool]
    if pool != "solo":
        argv += ["-c", str(concurrency)]
    argv += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    argv += ["-l", "warning", "-Q", queue(pool), "-n", f"bare-{pool}-{uuid.uuid4().hex[:6]}@%h"]
    return argv


def queue(pool: str) -> str:
    return f"bare.{pool}"


def ready(pool: str) -> bool:
    """A worker of `pool` answers (a ping to every worker, one reply per worker)."""
    return workers(pool) > 0


def round_trips(n: int, pool: str) -> list[float]:
    """`n` `apply_async().get()` of the no-op one after another on `pool`, in seconds."""
    times = []
    for _ in range(n):
        begun = time.perf_counter()
        if (value := noop.apply_async(queue=queue(pool)).get(timeout=30)) != "ok":
            raise RuntimeError(f"bare Celery ({pool}) returned {value!r}")
        times.append(time.perf_counter() - begun)
    return times


def rate(n: int, pool: str) -> float:
    """No-ops per second on the workers of `pool`: `n` sent at once, then every result read."""
    started = time.perf_counter()
    pending = [noop.apply_async(queue=queue(pool)) for _ in range(n)]
    for result in pending:
        if result.get(timeout=600) != "ok":
            raise RuntimeError(f"bare Celery's ({pool}) no-op failed")
    return n / (time.perf_counter() - started)


def workers(pool: str) -> int:
    """How many workers of `pool` answer a ping."""
    replies = app.control.ping(timeout=0.5) or []
    return sum(1 for reply in replies for name in reply if f"bare-{pool}-" in name)
