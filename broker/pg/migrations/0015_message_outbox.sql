-- Messages sent by the `message` tool, one row per call: a redelivered call finds its
-- first send here and returns that provider message id instead of sending again.

CREATE TABLE message_outbox (
    key text PRIMARY KEY,                   -- job id : call id
    job_id text NOT NULL,
    channel text NOT NULL,
    target text NOT NULL DEFAULT '',
    action text NOT NULL CHECK (action IN ('send', 'edit', 'note')),
    status text NOT NULL CHECK (status IN ('sending', 'sent', 'failed', 'unknown')),
    attempts integer NOT NULL DEFAULT 1,
    provider_id text NOT NULL DEFAULT '',
    error text NOT NULL DEFAULT '',
    forward_reason text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    sent_at timestamptz
);
CREATE INDEX message_outbox_job ON message_outbox (job_id);
