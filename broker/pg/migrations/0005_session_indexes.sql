-- A session's jobs (latest first) and an agent's sessions (newest first) are looked up on
-- every sessions_list, session_status and announcement delivery: without these, each is a
-- scan of every job.
CREATE INDEX jobs_session ON jobs (session_id, created_at);
CREATE INDEX sessions_agent_user ON sessions (agent_id, user_id, created_at);
