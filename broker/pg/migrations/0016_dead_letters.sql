-- Dead letters: calls that exhausted their deliveries (their process died each time) and
-- messages a worker could not decode, kept with the reason and the envelope as received.

CREATE TABLE dead_letters (
    id bigserial PRIMARY KEY,
    kind text NOT NULL CHECK (kind IN ('exhausted', 'undecodable')),
    reason text NOT NULL,
    queue text NOT NULL DEFAULT '',
    task text NOT NULL DEFAULT '',
    tool text NOT NULL DEFAULT '',
    job_id text NOT NULL DEFAULT '',
    turn integer NOT NULL DEFAULT 0,
    call_id text NOT NULL DEFAULT '',
    envelope jsonb,                         -- the call as received (NULL: undecodable)
    raw text NOT NULL DEFAULT '',           -- an undecodable body, as text
    attempts integer NOT NULL DEFAULT 0,
    status text NOT NULL DEFAULT 'dead' CHECK (status IN ('dead', 'retried')),
    retried_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now()
);
-- a call lands once, however many redeliveries find it exhausted
CREATE UNIQUE INDEX dead_letters_call ON dead_letters (job_id, turn, call_id)
    WHERE kind = 'exhausted';
CREATE INDEX dead_letters_created ON dead_letters (created_at);
