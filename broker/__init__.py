"""Everything that crosses a process boundary: settings, Celery app, messages, Redis, PostgreSQL."""
