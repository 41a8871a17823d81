-- The session that scheduled a job: an isolated run's result is announced there.
ALTER TABLE cron_jobs ADD COLUMN origin_session text NOT NULL DEFAULT '';
