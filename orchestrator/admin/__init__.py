"""Administration, implemented once for the CLI, the API and the remote client."""
