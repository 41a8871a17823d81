-- A scheduled job carries the rules of the job that scheduled it (allow/ask/deny, the
-- permission mode, and whether that job was an admin's): its runs never get more.
ALTER TABLE cron_jobs ADD COLUMN rules jsonb NOT NULL DEFAULT '{}';
