"""The Python client: direct (Redis and PostgreSQL) or remote (the HTTP API), one interface.

from orchestrator.client import Client
client = Client()  # CLAWQ_REDIS_URL / CLAWQ_DATABASE_URL from the environment
client = Client(api_url="https://clawq.example", api_key="clawq_…")  # over the HTTP API
"""

from orchestrator.client.base import Client, ClientError, Job, NotNow
from orchestrator.client.local import LocalClient, LocalJob
from orchestrator.client.remote import RemoteClient, RemoteJob

__all__ = [
    "Client",
    "ClientError",
    "Job",
    "LocalClient",
    "LocalJob",
    "NotNow",
    "RemoteClient",
    "RemoteJob",
]
