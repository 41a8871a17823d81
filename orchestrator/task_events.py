"""Celery task events for agent runs, so Flower shows them beside the tool calls.

Orchestrators consume the `agents` queue themselves, so no Celery worker reports agent runs;
the orchestrator sends the events a worker would (received, started, succeeded, failed,
revoked) with readable arguments (agent, label, depth, parent) and Celery's parent and root
ids, which is what Flower draws its task tree from. A few events per job, not per call.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from typing import Any

from celery import Celery

from broker.messages import AGENT_RUN_TASK, JobSpec

log = logging.getLogger("clawq.orchestrator")


class AgentTaskEvents:
    def __init__(self, app: Celery, enabled: bool) -> None:
        self.enabled = enabled
        self.hostname = f"orchestrator.{os.getpid()}@{socket.gethostname()}"
        self._lock = threading.Lock()
        self._dispatcher: Any = None
        self._app = app
        self._started: dict[str, float] = {}

    def _send(self, type_: str, fields: dict[str, Any]) -> None:
        with self._lock:
            if self._dispatcher is None:
                self._dispatcher = self._app.events.Dispatcher(
                    self._app.connection_for_write(), hostname=self.hostname, enabled=True
                )
            self._dispatcher.send(type_, **fields)

    async def send(self, type_: str, **fields: Any) -> None:
        """Best effort: a job never fails because its dashboard event was not sent."""
        if not self.enabled:
            return
        try:
            await asyncio.to_thread(self._send, type_, fields)
        except Exception as exc:
            log.warning("task event %s not sent: %s", type_, exc)

    async def started(self, job_id: str, spec: JobSpec) -> None:
        readable: dict[str, Any] = {"job_id": job_id, "agent": spec.agent_id}
        if spec.parent_id:
            readable |= {"label": spec.label, "depth": spec.depth, "parent": spec.parent_id}
        else:
            readable["prompt"] = spec.prompt[:80]
        await self.send(
            "task-received",
            uuid=job_id,
            name=AGENT_RUN_TASK,
            args="()",
            kwargs=repr(readable),
            root_id=spec.root_id or job_id,
            parent_id=spec.parent_id or None,
            retries=0,
            eta=None,
            expires=None,
        )
        self._started[job_id] = time.monotonic()
        await self.send("task-started", uuid=job_id)

    async def finished(self, job_id: str, status: str, text: str, error: str) -> None:
        runtime = time.monotonic() - self._started.pop(job_id, time.monotonic())
        if status == "completed":
            await self.send("task-succeeded", uuid=job_id, result=repr(text[:200]), runtime=runtime)
        elif status == "cancelled":
            await self.send(
                "task-revoked", uuid=job_id, terminated=True, signum=None, expired=False
            )
        else:
            await self.send(
                "task-failed", uuid=job_id, exception=f"{status}: {error[:200]}", traceback=""
            )

    def close(self) -> None:
        with self._lock:
            if self._dispatcher is not None:
                self._dispatcher.close()
                self._dispatcher.connection.close()
