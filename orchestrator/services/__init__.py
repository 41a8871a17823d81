"""The orchestrator's background duties, one per module, each with start and stop."""
