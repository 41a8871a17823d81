"""Celery tasks, one per registered tool, routed to the queue of the tool's group.

Routing is derived from the declarations: a tool's group is its queue. The task body is
the same for every tool; what differs is its name (readable in Flower) and its limits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery import Celery, Task, signals
from pydantic import ValidationError

from broker.config.settings import Settings
from broker.protocol import CallEnvelope, Group
from workers.execute import WorkerRuntime, runtime_for_process, stop_runtime
from workers.registry import Registry

TASK_PREFIX = "clawq.tool."


def task_name(tool: str) -> str:
    return TASK_PREFIX + tool


def register_tool_tasks(
    app: Celery, registry: Registry, settings: Settings, queues: Sequence[str]
) -> None:
    """Define `clawq.tool.<name>` for every tool, and start this process's runtime early.
    `queues`: the groups this worker consumes (one, or several light ones)."""
    node = settings.node()

    def runtime() -> WorkerRuntime:
        threads = int(app.conf.worker_concurrency or 1)
        return runtime_for_process(settings, registry, ",".join(queues), node, threads)

    def declare(name: str, group: str, timeout_s: float) -> None:
        def run(task: Task, envelope: Any = None, **unexpected: Any) -> None:
            """One call. A message that is not an envelope goes to the dead letters
            (acked: delivering it again cannot make it decode)."""
            try:
                decoded = CallEnvelope.model_validate(envelope)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "envelope"
                body = {"envelope": envelope, **unexpected}
                runtime().undecodable(body, name, f"not an envelope: {where}: {first['msg']}")
                return
            key = (task.request.delivery_info or {}).get("routing_key")
            runtime().run_call(decoded, str(key) if key in queues else group)  # a host's: its group

        limit = timeout_s + settings.tool_grace_s
        app.conf.task_routes[name] = {"queue": group}
        app.task(
            run,
            name=name,
            bind=True,
            shared=False,
            acks_late=True,
            reject_on_worker_lost=True,
            soft_time_limit=limit,
            time_limit=limit + settings.tool_grace_s,
            ignore_result=True,
        )

    for tool in registry:
        declare(task_name(tool.name), tool.group.value, tool.timeout_s)
    if Group.mcp.value in queues:  # every MCP tool shares one task
        from workers.tools.mcp.tool import MCP_TASK

        declare(MCP_TASK, Group.mcp.value, settings.mcp_call_total_s)
    if Group.runtime.value in queues:  # and every custom tool
        from workers.tools.custom_tools.tool import CUSTOM_TASK

        declare(CUSTOM_TASK, Group.runtime.value, settings.custom_tool_max_timeout_s)

    if Group.memory.value in queues:  # and the indexing of memory documents
        from workers.tools.memory.index import INDEX_TASK, run_index_task

        def index(document_id: int, version: int = 0) -> None:
            rt = runtime()
            run_index_task(settings, rt.store(), rt.redis, document_id)

        app.conf.task_routes[INDEX_TASK] = {"queue": Group.memory.value}
        app.task(
            index,
            name=INDEX_TASK,
            shared=False,
            acks_late=True,
            reject_on_worker_lost=True,
            soft_time_limit=settings.memory_index_timeout_s,
            time_limit=settings.memory_index_timeout_s + settings.tool_grace_s,
            ignore_result=True,
        )

    if Group.messaging.value in queues:  # and a person's requests sent to a chat
        from workers.tools.messaging.requests import NOTIFY_TASK, notify

        def notify_task(request_id: str, channel: str, chat: str) -> None:
            notify(settings, runtime().store().conn, request_id, channel, chat)

        app.conf.task_routes[NOTIFY_TASK] = {"queue": Group.messaging.value}
        app.task(
            notify_task,
            name=NOTIFY_TASK,
            shared=False,
            acks_late=True,
            reject_on_worker_lost=True,
            soft_time_limit=60,
            time_limit=60 + settings.tool_grace_s,
            ignore_result=True,
        )

    if Group.messaging.value in queues:  # and a job's answer written live in its chat
        from workers.tools.messaging.preview import PREVIEW_TASK, WORK_S, PreviewWriter

        def resend(job_id: str, countdown: float = 0.0) -> None:
            runtime().celery().send_task(
                PREVIEW_TASK, args=[job_id], queue=Group.messaging.value, countdown=countdown
            )

        def preview_task(job_id: str) -> None:
            rt = runtime()
            rt.follow_config()  # the channels in force now
            PreviewWriter(rt.settings, rt.redis, resend).run(job_id)

        app.conf.task_routes[PREVIEW_TASK] = {"queue": Group.messaging.value}
        app.task(
            preview_task,
            name=PREVIEW_TASK,
            shared=False,
            acks_late=True,
            reject_on_worker_lost=True,
            soft_time_limit=WORK_S + 60,
            time_limit=WORK_S + 60 + settings.tool_grace_s,
            ignore_result=True,
        )

    def start() -> None:
        runtime()
        if Group.messaging.value in queues:  # wake finals that were not written again
            from workers.tools.messaging.preview import FinalsSweeper

            rt = runtime()
            FinalsSweeper(lambda: rt.settings, rt.redis, resend).start()
        if Group.memory.value in queues:  # resend index tasks that were lost
            from workers.tools.memory.index import INDEX_TASK, Sweeper

            celery = runtime().celery()
            Sweeper(
                settings,
                lambda doc: celery.send_task(INDEX_TASK, args=[doc], queue=Group.memory.value),
            ).start()
        if Group.mcp.value in queues:  # MCP sessions open at start: they list the catalog
            from workers.tools.mcp.client import manager_for_process

            manager_for_process(settings)

    def received(sender: Any = None, request: Any = None, **_: Any) -> None:
        """A call taken off the queue is held from now (a threads pool keeps some waiting
        for a thread): the heartbeat lists it, so no watchdog sends it again meanwhile."""
        if app.conf.worker_pool == "prefork":  # received by the parent, run by a child
            return
        envelope = (getattr(request, "kwargs", None) or {}).get("envelope")
        if isinstance(envelope, dict) and envelope.get("call_id"):
            runtime().hold(envelope.get("job_id", ""), envelope.get("turn", 0), envelope["call_id"])

    signals.task_received.connect(received, weak=False)
    # prefork children and solo pools start at their pool's init; a threads pool, once
    # the worker is ready
    signals.worker_process_init.connect(lambda **_: start(), weak=False)
    signals.worker_ready.connect(
        lambda sender=None, **_: start() if app.conf.worker_pool == "threads" else None,
        weak=False,
    )
    signals.worker_process_shutdown.connect(lambda **_: stop_runtime(), weak=False)
