"""Celery task events for agent runs, so Flower shows them beside the tool calls.

Orchestrators consume the `agents` queue themselves, so no Celery worker reports agent runs;
the orchestrator sends the events a worker would (received, started, succeeded, failed,
revoked) with readable arguments (agent, label, depth, parent) and Celery's parent and root
ids, which is what Flower draws its task tree from. A few events per job, not per call.

Celery and kombu build the events (broker/celery/publisher.py `EventMessages`); their PUBLISHes
ride in the Redis pipelines the job makes anyway as it starts and ends: no round trip,
thread or synchronous socket of their own.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from celery import Celery

from broker.celery.publisher import EventMessages
from broker.protocol import AGENT_RUN_TASK, JobSpec

log = logging.getLogger("clawq.orchestrator")


class AgentTaskEvents:
    def __init__(self, app: Celery, enabled: bool) -> None:
        self.enabled = enabled
        self.hostname = f"orchestrator.{os.getpid()}@{socket.gethostname()}"
        self.messages = EventMessages(app, self.hostname)
        self._started: dict[str, float] = {}

    def prepare(self) -> None:
        """Make the (synchronous) kombu channel now, off the event loop."""
        if self.enabled:
            self.messages.build([])

    def send(self, pipe: Any, events: list[tuple[str, dict[str, Any]]]) -> None:
        """Add the events' PUBLISHes to `pipe`. Best effort: a job never fails because its
        dashboard event was not sent."""
        if not self.enabled:
            return
        try:
            for topic, payload in self.messages.build(events):
                pipe.publish(topic, payload)
        except Exception as exc:
            log.warning("task events %s not sent: %s", [t for t, _ in events], exc)

    def started(self, pipe: Any, job_id: str, spec: JobSpec) -> None:
        readable: dict[str, Any] = {"job_id": job_id, "agent": spec.agent_id}
        if spec.parent_id:
            readable |= {"label": spec.label, "depth": spec.depth, "parent": spec.parent_id}
        else:
            readable["prompt"] = spec.prompt[:80]
        received = {
            "uuid": job_id,
            "name": AGENT_RUN_TASK,
            "args": "()",
            "kwargs": repr(readable),
            "root_id": spec.root_id or job_id,
            "parent_id": spec.parent_id or None,
            "retries": 0,
            "eta": None,
            "expires": None,
        }
        self.send(pipe, [("task-received", received), ("task-started", {"uuid": job_id})])
        self._started[job_id] = time.monotonic()

    def parked(self, job_id: str) -> None:
        """The job left this process (waiting for people): its start is forgotten here."""
        self._started.pop(job_id, None)

    def finished(self, pipe: Any, job_id: str, status: str, text: str, error: str) -> None:
        runtime = time.monotonic() - self._started.pop(job_id, time.monotonic())
        if status == "completed":
            event = (
                "task-succeeded",
                {"uuid": job_id, "result": repr(text[:200]), "runtime": runtime},
            )
        elif status == "cancelled":
            event = (
                "task-revoked",
                {"uuid": job_id, "terminated": True, "signum": None, "expired": False},
            )
        else:
            event = (
                "task-failed",
                {"uuid": job_id, "exception": f"{status}: {error[:200]}", "traceback": ""},
            )
        self.send(pipe, [event])

    def close(self) -> None:
        self.messages.close()
