"""The scheduler's ticker, inside every orchestrator (no extra daemon): once a second it
runs one tick on PostgreSQL (`CronStore.tick`: due jobs claimed with SKIP LOCKED, one run
per scheduled time), sends the agent runs it created, and settles the runs whose jobs
ended (retries with backoff, webhooks). Any number of orchestrators tick; each due job is
taken by one of them, and a killed one leaves nothing half done: its transaction is gone,
or its runs' jobs exist and are sent again."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

from celery import Celery

from broker.config.settings import Settings
from broker.pg.store import Store
from broker.protocol import AGENT_RUN_TASK, AGENTS_QUEUE
from broker.stores.cron import CronStore
from orchestrator.services.service import Periodic

log = logging.getLogger(__name__)


class Ticker:
    def __init__(self, settings: Settings, app: Celery) -> None:
        self.settings = settings
        self.app = app
        self.store: Store | None = None
        self.redis: Any = None

    def tick(self, now: datetime | None = None) -> int:
        """One tick; returns how many agent runs it sent."""
        now = now or datetime.now(UTC)
        if self.store is None:
            self.store = Store(self.settings.database_url)
        cron = CronStore(self.store.conn)
        try:
            started = cron.tick(now)
            resend, finished = cron.settle(now)
        except Exception:
            self.store.close()  # a broken connection is not reused
            self.store = None
            raise
        for job_id in [*started, *resend]:
            self.app.send_task(
                AGENT_RUN_TASK, kwargs={"job_id": job_id}, queue=AGENTS_QUEUE, task_id=job_id
            )
        for run, row in finished:
            self._deliver(run, row)
        return len(started) + len(resend)

    def _deliver(self, run: Any, row: dict[str, Any]) -> None:
        """Where a finished run's result goes. `session`: a run in an existing session is
        its own delivery (its transcript); an isolated run's result is announced to the
        session that scheduled it, through the announce queue, like a subagent's.
        `webhook`: a JSON POST through the egress client."""
        job = row
        if job["delivery"] == "none":
            return
        body = {
            "name": job["name"],
            "scheduled_at": run.scheduled_at.isoformat(),
            "status": row["job_status"],
            "text": row["final_text"] or "",
            "error": row["job_error"] or "",
        }
        if job["delivery"] == "session":
            if not job["session_id"] and job["origin_session"]:
                self._announce(job["origin_session"], body)
            return
        if not job["webhook_url"]:
            return
        from workers.egress.client import egress_for

        try:
            egress_for(self.settings).request("POST", job["webhook_url"], json=body)
        except Exception as exc:
            log.warning("cron %s: webhook delivery failed: %s", job["name"], exc)

    def _announce(self, session: str, body: dict[str, Any]) -> None:
        import redis

        from broker.redis.announce import AnnounceItem, AnnounceQueue

        if self.redis is None:
            self.redis = redis.Redis.from_url(self.settings.redis_url)
        s = self.settings
        text = body["text"] if body["status"] == "completed" else body["error"]
        item = AnnounceItem(
            kind="text",
            result=f"[scheduled job {body['name']} at {body['scheduled_at']}: "
            f"{body['status']}]\n{text}",
        )
        AnnounceQueue(self.redis, s.announce_debounce_s, s.announce_drain_at).push(session, item)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        if self.redis is not None:
            self.redis.close()


class CronService(Periodic):
    """The ticker as the orchestrator's duty: every orchestrator ticks, PostgreSQL makes
    each scheduled time start once."""

    name = "cron"

    def __init__(self, settings: Settings, app: Celery) -> None:
        super().__init__()
        self.interval_s = settings.cron_tick_s
        self.ticker = Ticker(settings, app)

    async def tick(self) -> None:
        await asyncio.to_thread(self.ticker.tick)

    async def stop(self) -> None:
        await super().stop()
        self.ticker.close()
