-- Context files and memory: documents routed away from the disk by the fs tools.
-- Versions come from one sequence, so a deleted and re-created document never reuses one
-- and a write that checks the version it read cannot be fooled.

CREATE SEQUENCE document_versions;

-- What an agent is: "open" (every context file per user, the agent's copy a template) or
-- "predefined" (only USER.md and BOOTSTRAP.md per user; the rest the agent's, read-only
-- to jobs). An agent without a row is open.
CREATE TABLE agents (
    id text PRIMARY KEY,
    kind text NOT NULL DEFAULT 'open' CHECK (kind IN ('open', 'predefined')),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- user_id '' is the agent's own copy (the template of an open agent).
CREATE TABLE context_files (
    agent_id text NOT NULL,
    user_id text NOT NULL DEFAULT '',
    name text NOT NULL,
    content text NOT NULL,
    version bigint NOT NULL DEFAULT nextval('document_versions'),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (agent_id, user_id, name)
);

-- user_id '' is the agent's global memory.
CREATE TABLE memory_documents (
    id bigserial PRIMARY KEY,
    agent_id text NOT NULL,
    user_id text NOT NULL DEFAULT '',
    path text NOT NULL,
    content text NOT NULL,
    version bigint NOT NULL DEFAULT nextval('document_versions'),
    updated_at timestamptz NOT NULL DEFAULT now(),
    indexed_version bigint NOT NULL DEFAULT 0,
    indexed_at timestamptz,
    index_error text NOT NULL DEFAULT '',
    UNIQUE (agent_id, user_id, path)
);

-- Chunks of indexed documents. Full text is generated here, embeddings or not; the
-- embedding is a plain array (searched exactly), indexed by pgvector's HNSW per model
-- when that extension is there.
CREATE TABLE memory_chunks (
    id bigserial PRIMARY KEY,
    document_id bigint NOT NULL REFERENCES memory_documents (id) ON DELETE CASCADE,
    agent_id text NOT NULL,
    user_id text NOT NULL,
    start_line integer NOT NULL,
    end_line integer NOT NULL,
    content text NOT NULL,
    hash text NOT NULL,
    tsv_english tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    tsv_simple tsvector GENERATED ALWAYS AS (to_tsvector('simple', content)) STORED,
    model text NOT NULL DEFAULT '',
    embedding real[]
);
CREATE INDEX memory_chunks_scope ON memory_chunks (agent_id, user_id);
CREATE INDEX memory_chunks_document ON memory_chunks (document_id);
CREATE INDEX memory_chunks_hash ON memory_chunks (hash, model);
CREATE INDEX memory_chunks_english ON memory_chunks USING gin (tsv_english);
CREATE INDEX memory_chunks_simple ON memory_chunks USING gin (tsv_simple);

-- A scope's chunk version: bumped by every change of its chunks, so a process that holds
-- a scope's vectors in memory knows with one read whether they are still current.
CREATE TABLE memory_scopes (
    agent_id text NOT NULL,
    user_id text NOT NULL,
    chunks_version bigint NOT NULL,
    PRIMARY KEY (agent_id, user_id)
);

-- Documents waiting to be indexed: written in the transaction of the write, removed by
-- the index task when it is done, sent again by the sweeper when a task was lost.
CREATE TABLE memory_outbox (
    document_id bigint PRIMARY KEY REFERENCES memory_documents (id) ON DELETE CASCADE,
    version bigint NOT NULL,
    job_id text NOT NULL DEFAULT '',
    attempts integer NOT NULL DEFAULT 0,
    next_at timestamptz NOT NULL DEFAULT now()
);
