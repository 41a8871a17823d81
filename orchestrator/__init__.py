"""Agent loops, model providers, dispatch of tool calls, the Python client and the CLI."""
