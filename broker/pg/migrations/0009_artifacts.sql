-- Artifacts: binary results (screenshots, PDFs, downloads, audio) stored once by content
-- hash; each result that produced one gets its own row, owned by the job's user.

CREATE TABLE artifact_blobs (
    hash text PRIMARY KEY,             -- sha256 of the bytes
    size bigint NOT NULL,
    data bytea,                        -- NULL when the bytes live in the file store
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE artifacts (
    id text PRIMARY KEY,
    hash text NOT NULL REFERENCES artifact_blobs (hash),
    mime text NOT NULL,
    size bigint NOT NULL,
    width integer,
    height integer,
    name text NOT NULL DEFAULT '',
    user_id text NOT NULL DEFAULT '',
    session_id text NOT NULL DEFAULT '',
    job_id text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX artifacts_expiry ON artifacts (expires_at);
CREATE INDEX artifacts_hash ON artifacts (hash);
