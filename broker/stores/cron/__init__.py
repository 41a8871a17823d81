"""Cron: scheduled jobs' entries and runs (`store.py`), and their schedules (`schedule.py`)."""

from broker.stores.cron.store import CronError, CronJob, CronRules, CronStore, run_job_id

__all__ = ["CronError", "CronJob", "CronRules", "CronStore", "run_job_id"]
