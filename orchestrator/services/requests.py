"""Parked jobs' requests past their time: closed as `timeout`, and the job queued again to
take that answer (its call denied, or the job cancelled, as it chose). A job waiting in
memory times its own requests out; this is for those no process holds."""

from __future__ import annotations

import asyncio
import logging

from celery import Celery

from broker.pg.store import AsyncStore
from broker.protocol import AGENT_RUN_TASK, AGENTS_QUEUE
from broker.stores import requests
from orchestrator.services.service import Periodic

log = logging.getLogger("clawq.orchestrator")


class RequestExpiry(Periodic):
    name = "request expiry"
    interval_s = 2.0

    def __init__(self, store: AsyncStore, app: Celery) -> None:
        super().__init__()
        self.store = store
        self.app = app

    async def tick(self) -> None:
        pool = self.store.pool
        for request_id, job_id in await requests.expired(pool):
            await requests.settle(pool, request_id, "timeout", "timeout")
            if await requests.wake_async(pool, job_id):  # several orchestrators: one wins
                log.info("request %s of parked job %s timed out", request_id, job_id)
                await asyncio.to_thread(
                    self.app.send_task,
                    AGENT_RUN_TASK,
                    kwargs={"job_id": job_id},
                    queue=AGENTS_QUEUE,
                )
