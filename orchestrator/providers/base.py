"""What a model provider is: one assistant turn from a conversation and tool definitions."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.errors import RunError
from orchestrator.conversation import Message, ToolCall

OnToolCall = Callable[[ToolCall], Awaitable[None]]


class ModelError(RunError):
    """The model could not produce a turn (transport, HTTP status, protocol, script)."""


@dataclass
class ModelRequest:
    system: str
    messages: list[Message]
    openai_tools: list[dict[str, Any]] = field(default_factory=list)
    anthropic_tools: list[dict[str, Any]] = field(default_factory=list)
    turn: int = 0  # index of this turn within the job


class ModelProvider(Protocol):
    async def complete(
        self, request: ModelRequest, on_tool_call: OnToolCall | None = None
    ) -> Message:
        """The assistant's next message. Streaming providers call `on_tool_call` as soon as
        each tool call is complete in the stream, before the turn ends."""
        ...
