"""The scheduler's ticker, inside every orchestrator (no extra daemon): once a second it
runs one tick on PostgreSQL (`CronStore.tick`: due jobs claimed with SKIP LOCKED, one run
per scheduled time), sends the agent runs it created, and settles the runs whose jobs
ended (retries with backoff, webhooks). Any number of orchestrators tick; each due job is
taken by one of them, and a killed one leaves nothing half done: its transaction is gone,
or its runs' jobs exist and are sent again."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from celery import Celery

from broker.cron_store import CronStore
from broker.messages import AGENT_RUN_TASK, AGENTS_QUEUE
from broker.settings import Settings
from broker.store import Store

log = logging.getLogger(__name__)


class Ticker:
    def __init__(self, settings: Settings, app: Celery) -> None:
        self.settings = settings
        self.app = app
        self.store: Store | None = None

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
        """A webhook delivery, through the egress client; a session delivery is the run's
        own transcript (the job ran in that session)."""
        job = self.store.conn.execute(  # type: ignore[union-attr]
            "SELECT name, delivery, webhook_url FROM cron_jobs WHERE id = %s", (run.cron_id,)
        ).fetchone()
        if not job or job["delivery"] != "webhook" or not job["webhook_url"]:
            return
        from workers.egress import egress_for

        body = {
            "name": job["name"],
            "scheduled_at": run.scheduled_at.isoformat(),
            "status": row["job_status"],
            "text": row["final_text"] or "",
            "error": row["job_error"] or "",
        }
        try:
            egress_for(self.settings).request("POST", job["webhook_url"], json=body)
        except Exception as exc:
            log.warning("cron %s: webhook delivery failed: %s", job["name"], exc)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
