"""The local stack: `clawq up` and `clawq demo`, the processes they supervise, the embedded
Redis and PostgreSQL, and the state file other commands find them by."""
