"""Custom tools: shell templates defined at run time, on the runtime queue."""
