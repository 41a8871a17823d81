"""Starting a worker process: a Celery worker on one group's queue."""

from __future__ import annotations

import os

from broker.celery_app import create_app
from broker.settings import Settings
from workers.registry import Registry
from workers.tasks import register_tool_tasks


def run_worker(
    settings: Settings,
    registry: Registry,
    group: str,
    concurrency: int | None = None,
    pool: str | None = None,
    log_level: str = "info",
) -> None:
    """Consume `group`'s queue until stopped. No gossip or mingle: workers need not know
    each other, and both cost start-up time and broker traffic on every node."""
    app = create_app(settings)
    register_tool_tasks(app, registry, settings, queue=group)
    app.worker_main(
        [
            "worker",
            "-Q",
            group,
            "-n",
            f"{group}.{os.getpid()}@%h",
            "--without-gossip",
            "--without-mingle",
            "-P",
            pool or settings.worker_pool,
            "-c",
            str(concurrency or settings.worker_concurrency),
            "-l",
            log_level.upper(),
        ]
    )
