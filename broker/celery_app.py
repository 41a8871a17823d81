"""The Celery app: configuration for long agent work, shared by every process."""

from __future__ import annotations

from celery import Celery

from broker.settings import Settings


def create_app(settings: Settings) -> Celery:
    """A Celery app on the settings' Redis, configured as DESIGN.md asks.

    JSON only; late acks that requeue when the executing process dies; prefetch 1 (tool
    calls are long and uneven); a visibility timeout above every hard limit; results are
    pushed by the tasks themselves, so Celery's result backend is unused.
    """
    app = Celery("clawq", broker=settings.redis_url, set_as_current=False)
    app.conf.update(
        broker_transport="broker.transport:Transport",
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        event_serializer="json",
        task_ignore_result=True,
        task_store_errors_even_if_ignored=False,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        worker_concurrency=settings.worker_concurrency,
        worker_pool=settings.worker_pool,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=settings.task_events,
        task_send_sent_event=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_s},
        broker_pool_limit=16,
        task_default_queue="default",
        enable_utc=True,
    )
    return app
