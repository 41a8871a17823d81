"""What both clients are: the direct one (`local`, Redis and PostgreSQL) and the remote one
(`remote`, the HTTP API) offer the same handles, so code written against one runs on the
other."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from broker.protocol import Event, JobResult, Subagent


class ClientError(Exception):
    """Bad input to the client, or an answer of the API's refusing it; nothing was done."""


def read_definition(config: dict[str, Any] | str | Path) -> dict[str, Any]:
    """A definition given as a dict, a JSON text or the path of a JSON file."""
    if isinstance(config, Path) or (
        isinstance(config, str) and not config.lstrip().startswith("{")
    ):
        config = Path(config).read_text()
    found = json.loads(config) if isinstance(config, str) else config
    if not isinstance(found, dict):
        raise ClientError("a definition is a JSON object")
    return found


class BaseJob(ABC):
    """A handle on one submitted job."""

    def __init__(self, job_id: str) -> None:
        self.id = job_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r})"

    @abstractmethod
    def events(self, after: str | None = None) -> Iterator[Event]:
        """Every event after the stream id `after` (None: from the start), until the job
        ends; pass the `id` of the last event seen to go on where a reader stopped."""

    @abstractmethod
    def wait(self, timeout: float | None = None) -> JobResult:
        """Block until the job ends (TimeoutError after `timeout` seconds)."""

    @abstractmethod
    def result(self) -> JobResult: ...

    @abstractmethod
    def approve(self, request_id: str, decision: str, by: str = "", admin: bool = True) -> None:
        """Answer an `approval_requested` event: allow-once, allow-always or deny."""

    @abstractmethod
    def steer(self, message: str) -> None:
        """Redirect a running job: its current work stops, and it goes on with `message`."""

    @abstractmethod
    def subagents(self) -> list[Subagent]: ...

    @abstractmethod
    def cancel(self) -> None:
        """Ask for the job to stop: no further turns; the job ends `cancelled`."""


class BaseClient(ABC):
    @abstractmethod
    def job(self, job_id: str) -> BaseJob: ...

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> BaseClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
