"""What a model provider is: one assistant turn from a conversation and tool definitions."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from broker.errors import RunError
from orchestrator.conversation import Message, ToolCall

OnToolCall = Callable[[ToolCall], Awaitable[None]]


class Deltas(Protocol):
    """Where a streaming provider puts the reply's text as it arrives: cheap, synchronous
    (the job coalesces it into `model_delta` events); `reset` when a reply is asked for again
    after some of its text was given (failover), so what was shown is discarded."""

    def text(self, chunk: str) -> None: ...

    def reset(self) -> None: ...


class ModelError(RunError):
    """The model could not produce a turn (transport, HTTP status, protocol, script)."""


class ModelUnavailable(ModelError):
    """A failure another try may not have (408, 409, 429, 5xx, 529, a timeout, a refused
    connection): failover retries, then moves to the next credential, then model."""

    def __init__(
        self,
        message: str,
        status: int = 0,
        retry_after: float | None = None,
        mid_stream: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after  # seconds the server asked for, if it said
        self.mid_stream = mid_stream


class ContextOverflow(ModelError):
    """The request was longer than the model's context window: compact, then ask again."""


@dataclass
class ModelRequest:
    system: str
    messages: list[Message]
    openai_tools: list[dict[str, Any]] = field(default_factory=list)
    anthropic_tools: list[dict[str, Any]] = field(default_factory=list)
    turn: int = 0  # index of this turn within the job
    purpose: Literal["turn", "summary"] = "turn"  # a summary of older turns (compaction)


class ModelProvider(Protocol):
    async def complete(
        self,
        request: ModelRequest,
        on_tool_call: OnToolCall | None = None,
        deltas: Deltas | None = None,
    ) -> Message:
        """The assistant's next message. Streaming providers call `on_tool_call` as soon as
        each tool call is complete in the stream, before the turn ends, and give `deltas`
        the text as it arrives."""
        ...
