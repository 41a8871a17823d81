"""The Celery app, its transport and the asyncio publisher of task messages."""
