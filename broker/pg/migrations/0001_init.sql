-- Sessions, jobs, transcripts and the durable half of the tool-call ledger.
CREATE TABLE sessions (
    id          text PRIMARY KEY,
    agent_id    text NOT NULL DEFAULT 'main',
    user_id     text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE jobs (
    id            text PRIMARY KEY,
    session_id    text NOT NULL REFERENCES sessions(id),
    status        text NOT NULL,
    spec          jsonb NOT NULL,
    final_text    text NOT NULL DEFAULT '',
    error         text NOT NULL DEFAULT '',
    iterations    integer NOT NULL DEFAULT 0,
    orchestrator  text NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL DEFAULT now(),
    started_at    timestamptz,
    finished_at   timestamptz
);
CREATE INDEX jobs_unfinished ON jobs (status) WHERE status IN ('queued', 'running');

CREATE TABLE messages (
    session_id  text NOT NULL REFERENCES sessions(id),
    seq         integer NOT NULL,
    job_id      text NOT NULL REFERENCES jobs(id),
    role        text NOT NULL,
    content     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE tool_calls (
    job_id       text NOT NULL REFERENCES jobs(id),
    turn         integer NOT NULL,
    call_id      text NOT NULL,
    seq          integer NOT NULL,
    name         text NOT NULL,
    input        jsonb NOT NULL,
    status       text NOT NULL,
    is_error     boolean NOT NULL DEFAULT false,
    for_llm      text NOT NULL DEFAULT '',
    for_user     text NOT NULL DEFAULT '',
    metadata     jsonb NOT NULL DEFAULT '{}',
    queue        text NOT NULL DEFAULT '',
    worker       text NOT NULL DEFAULT '',
    attempts     integer NOT NULL DEFAULT 0,
    queued_at    timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    PRIMARY KEY (job_id, turn, call_id)
);
