-- Scheduled agent jobs. PostgreSQL is the source of truth: a run is keyed by (job,
-- scheduled time), so a scheduled time can never start twice, whoever ticks.

CREATE TABLE cron_jobs (
    id text PRIMARY KEY,
    agent_id text NOT NULL,
    user_id text NOT NULL DEFAULT '',
    name text NOT NULL,
    schedule jsonb NOT NULL,
    prompt text NOT NULL,
    model text NOT NULL DEFAULT 'scripted',
    script jsonb,                               -- the scripted model's turns (tests, demos)
    workspace text NOT NULL,
    session_id text NOT NULL DEFAULT '',      -- '': a new isolated session per run
    delivery text NOT NULL DEFAULT 'session' CHECK (delivery IN ('session', 'webhook', 'none')),
    webhook_url text NOT NULL DEFAULT '',
    missed text NOT NULL DEFAULT 'run_once' CHECK (missed IN ('skip', 'run_once')),
    grace_s integer NOT NULL DEFAULT 300,
    anchor timestamptz NOT NULL DEFAULT now(),  -- `every` counts from here
    next_at timestamptz,                        -- NULL: nothing more to run
    enabled boolean NOT NULL DEFAULT true,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (agent_id, user_id, name)
);
CREATE INDEX cron_jobs_due ON cron_jobs (next_at) WHERE enabled;

CREATE TABLE cron_runs (
    cron_id text NOT NULL REFERENCES cron_jobs (id) ON DELETE CASCADE,
    scheduled_at timestamptz NOT NULL,
    status text NOT NULL CHECK (status IN ('queued', 'ok', 'failed', 'retry', 'skipped')),
    attempt integer NOT NULL DEFAULT 1,
    job_id text NOT NULL DEFAULT '',
    retry_at timestamptz,
    error text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    PRIMARY KEY (cron_id, scheduled_at)
);
CREATE INDEX cron_runs_open ON cron_runs (status) WHERE status IN ('queued', 'retry');
