"""Announcements on their way to their session: every due batch (finished subagents'
results, sessions_send messages) goes into the running job's inbox, or becomes a new job of
the session when none runs."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from celery import Celery

from broker.config.settings import Settings
from broker.pg.store import AsyncStore
from broker.protocol import AGENT_RUN_TASK, AGENTS_QUEUE, Event, JobSpec
from broker.redis import events
from broker.redis.announce import AnnounceItem, AnnounceQueue, batch_message
from orchestrator.services.service import Periodic

log = logging.getLogger("clawq.orchestrator")


class AnnounceDelivery(Periodic):
    name = "announce delivery"
    interval_s = 0.2

    def __init__(
        self,
        settings: Settings,
        store: AsyncStore,
        redis: Any,
        app: Celery,
        queue: AnnounceQueue,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.store = store
        self.redis = redis
        self.app = app
        self.queue = queue

    async def tick(self) -> None:
        batches = await asyncio.to_thread(self.queue.claim_due)
        for session, items in batches.items():
            await self.deliver(session, items)

    async def deliver(self, session: str, items: list[AnnounceItem]) -> None:
        text = batch_message(items)
        queue = self.queue
        job_id = await asyncio.to_thread(queue.deliver, session, len(items), text)
        if job_id is None:
            latest = await self.store.latest_job(session)
            if latest is None or latest["status"] == "cancelled":
                log.info("announcements for %s dropped: its session is gone or cancelled", session)
                await asyncio.to_thread(queue.ack, session, len(items))
                return
            if latest["status"] in ("queued", "running"):  # about to start, or ending now:
                job_id = latest["id"]  # its next turn reads the inbox, or it hands it back
                args = (job_id, session, len(items), text)
                if await asyncio.to_thread(queue.deliver_to_job, *args):
                    return await self.announced(job_id, items)
                await asyncio.to_thread(queue.retry_soon, session)  # it has just ended
                return
            spec = JobSpec.model_validate(latest["spec"])
            script = (spec.script or {}).get("on_announce") if spec.model == "scripted" else None
            spec = spec.model_copy(update={"prompt": text, "script": script, "announce": True})
            # the same batch always makes the same job: a retried delivery adds nothing
            job_id = uuid.uuid5(uuid.NAMESPACE_URL, session + items[0].model_dump_json()).hex
            await self.store.create_job(job_id, session, spec)
            await asyncio.to_thread(
                self.app.send_task,
                AGENT_RUN_TASK,
                kwargs={"job_id": job_id},
                queue=AGENTS_QUEUE,
                task_id=job_id,
                parent_id=latest["id"],
            )
            await asyncio.to_thread(queue.ack, session, len(items))
        await self.announced(job_id, items)

    async def announced(self, job_id: str, items: list[AnnounceItem]) -> None:
        children = [i.child for i in items if i.kind == "subagent"]
        data = {"to_job": job_id, "count": len(items), "children": children}
        ttl = self.settings.events_ttl_s
        for target in {job_id, *(i.parent_job for i in items if i.parent_job)}:
            await events.emit(
                self.redis, Event(type="announce_delivered", job_id=target, data=data), ttl
            )
