"""The baseline: bare Celery with its Redis result backend, default settings, a no-op task."""

from __future__ import annotations

import os

from celery import Celery

url = os.environ["BENCH_REDIS_URL"]
app = Celery("bare", broker=url, backend=url)
app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)


@app.task(name="bare.noop")
def noop() -> str:
    return "ok"
