"""The scripted model: replays a JSON script of turns (the demo's and the tests' model)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, ValidationError

from orchestrator.conversation import Message, TokenUsage, ToolCall
from orchestrator.providers.base import Deltas, ModelError, ModelRequest, OnToolCall


class ScriptedCall(BaseModel):
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ScriptedTurn(BaseModel):
    text: str = ""
    tool_calls: list[ScriptedCall] = Field(default_factory=list)
    usage: TokenUsage | None = None  # what a real provider would report (budget tests)


class Script(BaseModel):
    """`{"turns": [{"text": "...", "tool_calls": [{"id", "name", "input"}]}, {"text": "done"}]}`

    `subagents` are the scripts of the children it spawns, by label (`*`: any label);
    `on_announce` is the script of the job that an announcement starts in this session
    once this one has ended."""

    turns: list[ScriptedTurn] = Field(min_length=1)
    subagents: dict[str, Script] = Field(default_factory=dict)
    on_announce: Script | None = None

    def for_subagent(self, label: str) -> Script | None:
        return self.subagents.get(label) or self.subagents.get("*")


def parse_script(raw: Any) -> Script:
    if raw is None:
        raise ModelError('the scripted model needs a script: {"turns": [{"text": "..."}]}')
    try:
        return Script.model_validate(raw)
    except ValidationError as exc:
        raise ModelError(
            f"invalid script: {exc.errors()[0]['msg']} at {exc.errors()[0]['loc']}"
        ) from None


class ScriptedProvider:
    """Checks the whole script once, then keeps only its raw turns and reads the one asked
    for: a parsed copy of every job's script would be most of what a scripted job holds
    (bench (j) runs 10,000 at once)."""

    def __init__(self, script: dict[str, Any] | None) -> None:
        parse_script(script)  # a bad script fails the job at its start, not at its turn
        assert script is not None
        self.turns: list[Any] = script["turns"]

    async def complete(
        self,
        request: ModelRequest,
        on_tool_call: OnToolCall | None = None,
        deltas: Deltas | None = None,  # a script's turn comes whole: no deltas
    ) -> Message:
        if request.purpose == "summary":  # compaction: the script's turns are not used
            return Message(role="assistant", text=scripted_summary(request))
        if request.turn >= len(self.turns):
            raise ModelError(
                f"the script has {len(self.turns)} turns and turn {request.turn + 1} was "
                "asked for: end the script with a turn without tool calls"
            )
        turn = ScriptedTurn.model_validate(self.turns[request.turn])
        calls = [ToolCall(id=c.id, name=c.name, input=c.input) for c in turn.tool_calls]
        if on_tool_call:
            for call in calls:
                await on_tool_call(call)
        return Message(role="assistant", text=turn.text, tool_calls=calls, usage=turn.usage)


def scripted_summary(request: ModelRequest) -> str:
    """What the scripted model says when asked to summarise: how much it was given, and
    its first and last lines (a test can see what was summarised)."""
    text = "\n".join(m.text for m in request.messages)
    lines = text.strip().splitlines() or [""]
    return f"[summary of {len(text)} characters] {lines[0][:200]} … {lines[-1][:200]}"
