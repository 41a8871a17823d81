"""The Celery consumer of a worker, reconnecting to the broker within a second.

Celery's consumer retries a lost broker connection through kombu's `ensure_connection`
with its default pauses: 2 s, then 4, 6, … up to 30 s between tries, and gives up after
100. A Redis that is back after 20 s was then used up to 10 s later, and one away for
longer stopped the worker. Here the pauses start at 0.1 s and top out at one second, and
the consumer never gives up (`broker_connection_max_retries` None, set with it).
"""

from __future__ import annotations

from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

INTERVALS = {"interval_start": 0.1, "interval_step": 0.3, "interval_max": 1.0}
CONSUMER = "workers.consumer:Consumer"  # as Celery's `worker_consumer` setting names it


class Consumer(CeleryConsumer):  # type: ignore[misc]
    def ensure_connected(self, conn: Any) -> Any:
        original = conn.ensure_connection

        def ensure(*args: Any, **kwargs: Any) -> Any:
            return original(*args, **{**INTERVALS, **kwargs})

        conn.ensure_connection = ensure
        return super().ensure_connected(conn)
