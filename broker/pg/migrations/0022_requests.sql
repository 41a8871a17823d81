-- A person's requests (issue 31): approvals and questions (ask_user) in one table, kept until
-- answered however long it takes. A job whose every pending call waits for a person is
-- parked (status 'waiting') and resumed by whoever answers the last one.
ALTER TABLE approvals ADD COLUMN kind text NOT NULL DEFAULT 'approval';  -- or 'question'
ALTER TABLE approvals ADD COLUMN question jsonb;  -- {question, choices, multi}
ALTER TABLE approvals ADD COLUMN answer jsonb;  -- a question's answer
ALTER TABLE approvals ADD COLUMN answered_admin boolean NOT NULL DEFAULT false;
ALTER TABLE approvals ADD COLUMN expires_at timestamptz;  -- null: waits as long as it takes
ALTER TABLE approvals ADD COLUMN on_timeout text NOT NULL DEFAULT 'deny';  -- or 'cancel'
ALTER TABLE approvals ADD COLUMN user_id text NOT NULL DEFAULT '';  -- the job's user
-- one request per call: a resumed turn finds the one it opened
CREATE UNIQUE INDEX approvals_call ON approvals (job_id, turn, call_id);
CREATE INDEX approvals_pending ON approvals (user_id, requested_at) WHERE status = 'pending';
CREATE INDEX approvals_expiring ON approvals (expires_at)
    WHERE status = 'pending' AND expires_at IS NOT NULL;
