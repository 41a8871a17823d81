-- Permission decisions: the audit trail of every call, approvals, and allow-always grants.
ALTER TABLE tool_calls
    ADD COLUMN decision text NOT NULL DEFAULT '',
    ADD COLUMN decided_by text NOT NULL DEFAULT '',
    ADD COLUMN decision_reason text NOT NULL DEFAULT '';

CREATE TABLE approvals (
    id            text PRIMARY KEY,
    job_id        text NOT NULL REFERENCES jobs(id),
    turn          integer NOT NULL,
    call_id       text NOT NULL,
    tool          text NOT NULL,
    input         jsonb NOT NULL,
    reason        text NOT NULL,
    status        text NOT NULL DEFAULT 'pending',  -- allow-once, allow-always, deny, timeout
    answered_by   text NOT NULL DEFAULT '',
    requested_at  timestamptz NOT NULL DEFAULT now(),
    answered_at   timestamptz
);
CREATE INDEX approvals_job ON approvals (job_id);

CREATE TABLE permission_grants (
    agent_id    text NOT NULL,
    rule        text NOT NULL,
    granted_by  text NOT NULL,
    job_id      text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (agent_id, rule)
);
