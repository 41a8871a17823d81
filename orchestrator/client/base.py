"""What both clients are: the direct one (`local`, Redis and PostgreSQL) and the remote one
(`remote`, the HTTP API) offer the same handles, so code written against one runs on the
other. `Client(...)` chooses: with `api_url` the remote one, else the direct one (each kind
registers itself as it is defined, so this module imports neither)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar, TypedDict

from broker.config.settings import Settings
from broker.errors import Conflict, Invalid
from broker.protocol import Event, JobResult, Subagent
from broker.stores.requests import AnswerValue
from orchestrator.client.deltas import Delta, fold


class ClientError(Invalid):
    """Bad input to the client, or an answer of the API's refusing it; nothing was done."""


class NotNow(Conflict, ClientError):
    """The job is not in a state that allows it (it ended; the request was answered)."""


class JobOptions(TypedDict, total=False):
    """What a job may say beside its prompt (`Client.submit`'s keywords; the API's body)."""

    workspace: str
    model: str
    script: dict[str, Any] | None
    allow: Iterable[str]
    ask: Iterable[str]
    deny: Iterable[str]
    permission_mode: str
    agent: str
    max_iterations: int | None
    system: str
    channel: str
    chat_id: str
    budget: dict[str, Any] | None
    approval_timeout_s: float | None
    on_timeout: str | None


class ReplayChanges(TypedDict, total=False):
    """What a replay may change of the original (`Client.replay`'s keywords)."""

    model: str
    script: dict[str, Any] | None
    system: str
    allow: list[str]
    ask: list[str]
    deny: list[str]
    agent: str
    effects: str  # block (the default) or sandbox


class Job(ABC):
    """A handle on one submitted job. `Job(client, job_id)` is the handle of that client's
    kind (as `client.job(job_id)`)."""

    def __new__(cls, client: Client, job_id: str) -> Job:
        return super().__new__(client.job_kind if cls is Job else cls)

    def __init__(self, client: Client, job_id: str) -> None:
        self.id = job_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r})"

    @abstractmethod
    def events(self, after: str | None = None) -> Iterator[Event]:
        """Every event after the stream id `after` (None: from the start), until the job
        ends; pass the `id` of the last event seen to go on where a reader stopped."""

    def stream(self, after: str | None = None) -> Iterator[Delta]:
        """The job's output as typed deltas (client/deltas.py): the model's text as it
        arrives (`TextDelta`, `TextReset`), a running call's output (`ToolOutputDelta`)
        and an MCP call's progress (`ToolProgress`), then `JobEnded`. Pass the `event_id`
        of the last delta handled to go on where a reader stopped."""
        return fold(self.events(after))

    @abstractmethod
    def wait(self, timeout: float | None = None) -> JobResult:
        """Block until the job ends (TimeoutError after `timeout` seconds)."""

    @abstractmethod
    def result(self) -> JobResult: ...

    @abstractmethod
    def approve(self, request_id: str, decision: str, by: str = "", admin: bool = True) -> None:
        """Answer an `approval_requested` event: allow-once, allow-always or deny."""

    @abstractmethod
    def answer(
        self,
        request_id: str,
        answer: AnswerValue | None = None,
        by: str = "",
        *,
        decline: bool = False,
    ) -> None:
        """Answer an `input_requested` event: ask_user's with text, or one of its choices (a
        list of them when it allows several); an MCP server's (kind `elicitation`) with an
        object its schema accepts (or its JSON, or `name=value` texts), or `decline`."""

    @abstractmethod
    def steer(self, message: str) -> None:
        """Redirect a running job: its current work stops, and it goes on with `message`."""

    @abstractmethod
    def subagents(self) -> list[Subagent]: ...

    @abstractmethod
    def cancel(self) -> None:
        """Ask for the job to stop: no further turns; the job ends `cancelled`."""


class Client(ABC):
    kinds: ClassVar[dict[str, type[Client]]] = {}
    job_kind: ClassVar[type[Job]]

    def __init_subclass__(cls, kind: str = "", **rest: Any) -> None:
        super().__init_subclass__(**rest)
        if kind:
            Client.kinds[kind] = cls

    def __new__(
        cls,
        settings: Settings | None = None,
        *,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> Client:
        if cls is Client:
            cls = Client.kinds["remote" if api_url is not None else "local"]
        return super().__new__(cls)

    def job(self, job_id: str) -> Job:
        return self.job_kind(self, job_id)

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
