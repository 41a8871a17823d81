-- API keys of the HTTP API: only a hash of the secret is kept.
CREATE TABLE api_keys (
    id          text PRIMARY KEY,
    user_id     text NOT NULL,
    admin       boolean NOT NULL DEFAULT false,
    name        text NOT NULL DEFAULT '',
    secret_hash text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  text NOT NULL DEFAULT '',
    revoked_at  timestamptz,
    last_used_at timestamptz
);

-- Custom tools defined at run time (goclaw §8): a shell template per tool, global
-- (agent_id '') or per agent. Env secrets are sealed (AES-256-GCM): never plaintext here.
CREATE TABLE custom_tools (
    id              text PRIMARY KEY,
    name            text NOT NULL,
    agent_id        text NOT NULL DEFAULT '',
    description     text NOT NULL,
    parameters      jsonb NOT NULL,
    command         text NOT NULL,
    timeout_seconds integer NOT NULL DEFAULT 60,
    working_dir     text NOT NULL DEFAULT '.',
    env_names       jsonb NOT NULL DEFAULT '[]',
    env_sealed      text NOT NULL DEFAULT '',
    enabled         boolean NOT NULL DEFAULT true,
    version         integer NOT NULL DEFAULT 1,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (name, agent_id)
);
