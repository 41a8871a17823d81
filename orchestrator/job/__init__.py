"""One job's agent loop: its run, its turns, its prompt and its tools."""
