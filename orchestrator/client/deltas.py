"""A job's output as typed deltas (`job.stream()`): the model's text as it arrives, and the
job's end, folded from its events so a caller never handles `reset` or offsets itself.

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


class JobEnded(BaseModel):
    kind: Literal["ended"] = "ended"
    status: str
    final_text: str = ""
    error: str = ""
    event_id: str = ""


Delta = TextDelta | TextReset | JobEnded


def fold(events: Iterable[Event]) -> Iterator[Delta]:
    """The deltas these events say, in order. A reader that goes on mid-turn (`after`)
    starts that turn where its first delta says (`offset`)."""
    shown: dict[int, tuple[int, str]] = {}  # each turn: where this reader joined, text since
    for event in events:
        d, at = event.data, event.id
        turn = int(d.get("turn") or 0)
        start, have = shown.get(turn, (0, ""))
        if event.type == "model_delta":
            if d.get("reset"):
                shown[turn] = (0, "")
                yield TextReset(turn=turn, event_id=at)
                continue
            text, offset = str(d.get("text") or ""), int(d.get("offset") or 0)
            if turn not in shown:
                start = offset
            skip = start + len(have) - offset  # read twice: only what is new
            if skip > 0:
                text = text[skip:]
            shown[turn] = (start, have + text)
            if text:
                yield TextDelta(turn=turn, text=text, event_id=at)
        elif event.type == "turn_started":  # begun again (resumed): its old text is void
            if have:
                yield TextReset(turn=turn, event_id=at)
            shown.pop(turn, None)
        elif event.type == "model_text":
            final = str(d.get("text") or "")
            if not final[start:].startswith(have):
                yield TextReset(turn=turn, event_id=at)
                start, have = 0, ""
            if rest := final[start + len(have) :]:
                yield TextDelta(turn=turn, text=rest, final=True, event_id=at)
            shown[turn] = (start, final[start:])
        elif event.type == "job_finished":
            yield JobEnded(
                status=str(d.get("status") or ""),
                final_text=str(d.get("final_text") or ""),
                error=str(d.get("error") or ""),
                event_id=at,
            )
            return
