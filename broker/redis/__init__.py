"""Redis primitives: the hot ledger, queues, events, heartbeats, counters and limits (Lua where
atomic)."""
