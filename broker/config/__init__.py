"""Configuration: the settings from the environment, the live (reloadable) part in PostgreSQL, the
models of policy and MCP servers, sealed secrets."""
