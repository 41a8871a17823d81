-- Subagents: a child job knows the job that spawned it (Celery's parent_id), the job at the
-- root of its tree (root_id) and the parent's session (whose children it counts among);
-- `chain` is the rest of its Celery task graph, kept so a resumed run still continues it.
ALTER TABLE jobs
    ADD COLUMN parent_id      text,
    ADD COLUMN root_id        text,
    ADD COLUMN parent_session text,
    ADD COLUMN chain          jsonb,
    ADD COLUMN archived_at    timestamptz;
CREATE INDEX jobs_parent_session ON jobs (parent_session) WHERE parent_session IS NOT NULL;
CREATE INDEX jobs_root ON jobs (root_id) WHERE root_id IS NOT NULL;
