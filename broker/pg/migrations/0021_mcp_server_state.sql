-- How each MCP server's connection fares, as the mcp workers last saw it: `clawq mcp list`
-- shows why a server has no tools (its command not found, a refused connection).
ALTER TABLE mcp_servers ADD COLUMN state text NOT NULL DEFAULT '';
ALTER TABLE mcp_servers ADD COLUMN last_error text NOT NULL DEFAULT '';
ALTER TABLE mcp_servers ADD COLUMN state_at timestamptz;
