"""How a command is judged and confined: the shell parser, its safety checks, the host's bubblewrap
and the Docker sandbox."""
