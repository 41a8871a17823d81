"""The HTTP API: `orchestrator.api.app.create_app`, served by `clawq api`."""
