"""The Celery app: configuration for long agent work, shared by every process."""

from __future__ import annotations

from typing import Any

import redis
from celery import Celery

from broker import keys
from broker.config.settings import Settings
from broker.protocol import AGENT_RUN_TASK, AGENTS_QUEUE, ANNOUNCE_TASK, Group
from broker.redis.announce import AnnounceItem, AnnounceQueue
from broker.redis.connections import patient_redis

ANNOUNCE_RESULT_CHARS = 16_000  # of a child's final text, in its parent's conversation

# Queues that carry tasks other than tool calls (the announce step of a subagent's graph,
# memory indexing): their workers keep kombu's ack emulation, the only thing that would
# bring such a task back if the whole worker died holding it.
UNLEDGERED_QUEUES = frozenset({Group.sessions.value, Group.memory.value})


def create_app(settings: Settings, ack_emulation: bool = True) -> Celery:
    """A Celery app on the settings' Redis, configured as DESIGN.md asks.

    JSON only; late acks that requeue when the executing process dies; prefetch 1 (tool
    calls are long and uneven); a visibility timeout above every hard limit; results are
    pushed by the tasks themselves, so Celery's result backend is unused.

    `ack_emulation=False` is for workers of tool calls only. kombu's Redis transport
    emulates acks with an `unacked` hash and index: one round trip before each task and
    one after, and what a dead worker held comes back after the visibility timeout (an
    hour). A tool call needs neither: the ledger records who runs it, and the dispatcher's
    watchdog sends it again within seconds of that process's heartbeat stopping; a call
    taken but not yet begun when its whole worker died is answered after the
    schedule-to-start timeout, as it is with the emulation (whose hour comes later). A
    prefork child's death still requeues its message (`reject_on_worker_lost`), and a
    warm shutdown still gives back what it had not started (a process of a `direct`
    worker holds only the call it runs).
    """
    app = Celery("clawq", broker=settings.redis_url, set_as_current=False)
    app.conf.update(
        broker_transport="broker.celery.transport:Transport",
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
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_hijack_root_logger=False,
        worker_pool_restarts=True,  # the gateway's pool_restart
        worker_send_task_events=settings.task_events,
        task_send_sent_event=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout_s,
            "ack_emulation": ack_emulation,
        },
        broker_pool_limit=16,
        task_default_queue="default",
        enable_utc=True,
    )
    declare_agent_tasks(app, settings)
    return app


def declare_agent_tasks(app: Celery, settings: Settings) -> None:
    """The two steps of a subagent's task graph, known to every process so that a chain of
    them can be built anywhere: the agent run (executed by orchestrators, which consume the
    `agents` queue themselves) and the announce step (any `sessions` worker)."""

    def agent_run(job_id: str, **readable: Any) -> None:
        raise RuntimeError("agent runs are executed by `clawq orchestrator`, not by workers")

    app.conf.task_routes = {
        AGENT_RUN_TASK: {"queue": AGENTS_QUEUE},
        ANNOUNCE_TASK: {"queue": Group.sessions.value},
    }
    app.task(agent_run, name=AGENT_RUN_TASK, shared=False, ignore_result=True)

    clients: list[redis.Redis] = []

    def announce(result: dict[str, Any], parent_session: str, child: str, label: str) -> None:
        """Queue a finished child's result for its parent (once, however often it runs).
        A cancelled child is not announced: whoever cancelled it knows."""
        if result.get("status") == "cancelled":
            return
        if not clients:  # waits for a Redis that is away: the result must not be dropped
            clients.append(patient_redis(settings.redis_url, settings.outage_retry_s))
        client = clients[0]
        if not client.set(keys.announced(child), 1, nx=True, ex=settings.events_ttl_s):
            return
        text = result.get("final_text") or result.get("error") or "(no result)"
        item = AnnounceItem(
            child=child,
            parent_job=result.get("parent_id", ""),
            label=label,
            status=result.get("status", ""),
            result=text[:ANNOUNCE_RESULT_CHARS],
        )
        queue = AnnounceQueue(client, settings.announce_debounce_s, settings.announce_drain_at)
        queue.push(parent_session, item)

    app.task(announce, name=ANNOUNCE_TASK, shared=False, acks_late=True, ignore_result=True)
