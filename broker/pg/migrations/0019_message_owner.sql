-- Who sent each message: `message` edits only a message its own job or session sent, so
-- the session is kept beside the job, and a sent message is found by its provider id.
ALTER TABLE message_outbox ADD COLUMN session_id text NOT NULL DEFAULT '';
CREATE INDEX message_outbox_provider ON message_outbox (channel, provider_id);
