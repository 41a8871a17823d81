"""Group mcp: MCP servers' tools, their sessions and results."""
