-- What each MCP server told the mcp workers when they last listed it (the negotiated
-- protocol version, its prompts and resource templates), shown by `clawq mcp list`; and
-- the OAuth grants of servers that need one, sealed with the secret box.
CREATE TABLE mcp_server_facts (
    server      text PRIMARY KEY REFERENCES mcp_servers(name) ON DELETE CASCADE,
    facts       jsonb NOT NULL DEFAULT '{}',
    listed_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE mcp_oauth (
    server      text NOT NULL REFERENCES mcp_servers(name) ON DELETE CASCADE,
    subject     text NOT NULL DEFAULT '',   -- '' for the server's own grant
    sealed      text NOT NULL,              -- the tokens and client, sealed (see oauth.py)
    expires_at  double precision,           -- of the access token (epoch seconds)
    status      text NOT NULL DEFAULT 'ok', -- ok | revoked | failed
    detail      text NOT NULL DEFAULT '',
    version     bigint NOT NULL DEFAULT 1,  -- bumped at each refresh
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (server, subject)
);
