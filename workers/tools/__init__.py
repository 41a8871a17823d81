"""Native tools, one package per group."""
