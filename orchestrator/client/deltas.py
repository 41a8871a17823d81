"""A job's output as typed deltas (`job.stream()`): the model's text as it arrives, a
running command's output, an MCP call's progress, and the job's end, folded from its
events so a caller never handles `reset` or offsets itself.

Text comes per turn (`TextDelta.turn`). A `TextReset` says the turn's text so far is void
(the model was asked again: failover, or a job resumed by another orchestrator); the text
that follows replaces it. A turn whose reply was not streamed (a scripted model), or whose
deltas were lost, is completed from its final text (`final=True`), so the text a turn
yields always equals what the transcript keeps. `JobEnded` is the last item.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Literal

from pydantic import BaseModel

from broker.protocol import Event


class TextDelta(BaseModel):
    kind: Literal["text"] = "text"
    turn: int
    text: str
    final: bool = False  # completed from the turn's final text, not streamed
    event_id: str = ""  # the stream id to resume after (`job.stream(after=...)`)


class TextReset(BaseModel):
    kind: Literal["reset"] = "reset"
    turn: int  # discard what this turn showed so far
    event_id: str = ""


class ToolOutputDelta(BaseModel):
    """A running command's output (exec, custom tools, a background process), as it came."""

    kind: Literal["tool_output"] = "tool_output"
    call_id: str  # for a background process: the call that started it
    name: str
    stream: str  # stdout or stderr
    text: str
    truncated: bool = False  # the call's live output ends here (its result has the rest)
    process: str = ""  # the background process's id (`process` calls), else empty
    event_id: str = ""


class ToolProgress(BaseModel):
    """A running call's progress as its MCP server reports it (`tool_call_progress`)."""

    kind: Literal["tool_progress"] = "tool_progress"
    call_id: str
    name: str
    progress: float
    total: float | None = None
    message: str = ""
    event_id: str = ""


class JobEnded(BaseModel):
    kind: Literal["ended"] = "ended"
    status: str
    final_text: str = ""
    error: str = ""
    event_id: str = ""


Delta = TextDelta | TextReset | ToolOutputDelta | ToolProgress | JobEnded


class Folder:
    """Turns events into deltas one at a time (for a reader that handles the other events
    too, as `clawq run`). A reader that goes on mid-turn (`after`) starts that turn where
    its first delta says (`offset`)."""

    def __init__(self) -> None:
        self.shown: dict[int, tuple[int, str]] = {}  # a turn: where we joined, text since

    def take(self, event: Event) -> list[Delta]:
        d, at = event.data, event.id
        turn = int(d.get("turn") or 0)
        start, have = self.shown.get(turn, (0, ""))
        if event.type == "model_delta":
            if d.get("reset"):
                self.shown[turn] = (0, "")
                return [TextReset(turn=turn, event_id=at)]
            text, offset = str(d.get("text") or ""), int(d.get("offset") or 0)
            if turn not in self.shown:
                start = offset
            skip = start + len(have) - offset  # read twice: only what is new
            if skip > 0:
                text = text[skip:]
            self.shown[turn] = (start, have + text)
            return [TextDelta(turn=turn, text=text, event_id=at)] if text else []
        if event.type == "turn_started":  # begun again (resumed): its old text is void
            self.shown.pop(turn, None)
            return [TextReset(turn=turn, event_id=at)] if have else []
        if event.type == "model_text":
            final, out = str(d.get("text") or ""), list[Delta]()
            if not final[start:].startswith(have):
                out.append(TextReset(turn=turn, event_id=at))
                start, have = 0, ""
            if rest := final[start + len(have) :]:
                out.append(TextDelta(turn=turn, text=rest, final=True, event_id=at))
            self.shown[turn] = (start, final[start:])
            return out
        if event.type == "tool_output_delta":
            return [
                ToolOutputDelta(
                    call_id=str(d.get("call_id") or ""),
                    name=str(d.get("name") or ""),
                    stream=str(d.get("stream") or "stdout"),
                    text=str(d.get("text") or ""),
                    truncated=bool(d.get("truncated")),
                    process=str(d.get("process") or ""),
                    event_id=at,
                )
            ]
        if event.type == "tool_call_progress":
            total = d.get("total")
            return [
                ToolProgress(
                    call_id=str(d.get("call_id") or ""),
                    name=str(d.get("name") or ""),
                    progress=float(d.get("progress") or 0),
                    total=float(total) if total is not None else None,
                    message=str(d.get("message") or ""),
                    event_id=at,
                )
            ]
        if event.type == "job_finished":
            return [
                JobEnded(
                    status=str(d.get("status") or ""),
                    final_text=str(d.get("final_text") or ""),
                    error=str(d.get("error") or ""),
                    event_id=at,
                )
            ]
        return []


def fold(events: Iterable[Event]) -> Iterator[Delta]:
    """The deltas these events say, in order, until `JobEnded`."""
    folder = Folder()
    for event in events:
        for delta in folder.take(event):
            yield delta
            if isinstance(delta, JobEnded):
                return
