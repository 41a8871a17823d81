"""The baseline: bare Celery with its Redis result backend, default settings, a no-op task."""

from __future__ import annotations

import os
import sys
import time

from celery import Celery

url = os.environ["BENCH_REDIS_URL"]
app = Celery("bare", broker=url, backend=url)
app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)


@app.task(name="bare.noop")
def noop() -> str:
    return "ok"


# its worker, as (a) and (i) start it: one executing process, Celery's default pool (prefork)
WORKER = [sys.executable, "-m", "celery", "-A", "bench.bare", "worker", "-P", "prefork"]
WORKER += ["-c", "1", "--without-gossip", "--without-mingle", "--without-heartbeat"]
WORKER += ["-l", "warning", "-Q", "celery"]


def round_trips(n: int) -> list[float]:
    """`n` `delay().get()` of the no-op one after another, in seconds."""
    times = []
    for _ in range(n):
        begun = time.perf_counter()
        if (value := noop.delay().get(timeout=30)) != "ok":
            raise RuntimeError(f"bare Celery returned {value!r}")
        times.append(time.perf_counter() - begun)
    return times
