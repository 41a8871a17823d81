-- MCP servers, the tools they list (the catalog orchestrators show to models), grants per
-- agent and per user, and access requests that become grants when approved.
CREATE TABLE mcp_servers (
    name        text PRIMARY KEY,
    config      jsonb NOT NULL,
    enabled     boolean NOT NULL DEFAULT true,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE mcp_tools (
    server        text NOT NULL REFERENCES mcp_servers(name) ON DELETE CASCADE,
    tool          text NOT NULL,
    exposed_name  text NOT NULL UNIQUE,
    description   text NOT NULL DEFAULT '',
    input_schema  jsonb NOT NULL,
    listed_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (server, tool)
);

CREATE TABLE mcp_grants (
    server      text NOT NULL REFERENCES mcp_servers(name) ON DELETE CASCADE,
    scope       text NOT NULL CHECK (scope IN ('agent', 'user')),
    subject     text NOT NULL,
    tool_allow  jsonb NOT NULL DEFAULT '[]',
    tool_deny   jsonb NOT NULL DEFAULT '[]',
    enabled     boolean NOT NULL DEFAULT true,
    granted_by  text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (server, scope, subject)
);

CREATE TABLE mcp_access_requests (
    id           text PRIMARY KEY,
    server       text NOT NULL REFERENCES mcp_servers(name) ON DELETE CASCADE,
    scope        text NOT NULL CHECK (scope IN ('agent', 'user')),
    subject      text NOT NULL,
    tool_allow   jsonb NOT NULL DEFAULT '[]',
    reason       text NOT NULL DEFAULT '',
    status       text NOT NULL DEFAULT 'pending'
                 CHECK (status IN ('pending', 'approved', 'rejected')),
    requested_by text NOT NULL DEFAULT '',
    reviewed_by  text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    reviewed_at  timestamptz
);
CREATE INDEX mcp_access_requests_pending ON mcp_access_requests (created_at)
    WHERE status = 'pending';
