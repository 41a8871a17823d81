"""The provider-neutral conversation: what is stored in the transcript and sent to models."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class ToolCall(BaseModel):
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)
    raw_input: str | None = Field(None, description="arguments that were not a JSON object")


class ToolResultBlock(BaseModel):
    call_id: str
    name: str
    content: str
    is_error: bool = False


class TokenUsage(BaseModel):
    """What a provider said one reply cost (budgets, metrics); not kept in the transcript."""

    input: int = 0
    output: int = 0

    @property
    def total(self) -> int:
        return self.input + self.output


class Message(BaseModel):
    """One entry of the transcript. A `compaction` entry holds a summary of the messages
    before position `covers`: requests use it in their place (they stay stored)."""

    role: Literal["user", "assistant", "tool", "compaction"]
    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    results: list[ToolResultBlock] = Field(default_factory=list)
    covers: int = 0  # compaction: the messages before this position are summarised
    job_id: str = ""
    usage: TokenUsage | None = None
    # who answered (failover): `provider:model` and the credential's label; not stored
    model: str = ""
    credential: str = ""

    def content(self) -> dict[str, Any]:
        return self.model_dump(
            exclude={"role", "job_id", "usage", "model", "credential"}, exclude_defaults=True
        )

    @classmethod
    def from_row(cls, role: str, content: dict[str, Any], job_id: str = "") -> Message:
        return cls.model_validate({**content, "role": role, "job_id": job_id})
