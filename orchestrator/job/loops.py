"""Loop detection: the same call (tool and canonical input) made again and again in a row.

At `loop_repeat_warn` (N) repeats the model is warned with the call's result; at 2N the
call is not run and the job stops, `looping` (0: never). Calls are counted in the order
the model made them, across turns, once per turn (a batch of the same call in one turn is
not a loop); a different call in between starts the count again."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from orchestrator.conversation import Message, ToolCall

Verdict = Literal["ok", "warn", "stop"]


def signature(call: ToolCall) -> str:
    """A call's tool and input, the same however its keys were ordered."""
    given = call.raw_input if call.raw_input is not None else call.input
    return call.name + " " + json.dumps(given, sort_keys=True, separators=(",", ":"))


@dataclass
class LoopGuard:
    warn_at: int
    last: str = ""
    turn: int = -1
    run: int = 0

    def see(self, call: ToolCall, turn: int) -> Verdict:
        sig = signature(call)
        if sig != self.last:
            self.run = 1
        elif turn != self.turn:
            self.run += 1
        self.last, self.turn = sig, turn
        if not self.warn_at:
            return "ok"
        if self.run >= 2 * self.warn_at:
            return "stop"
        return "warn" if self.run >= self.warn_at else "ok"

    def replay(self, messages: list[Message], job_id: str) -> None:
        """Count again the calls this job made before it was resumed."""
        turn = 0
        for m in messages:
            if m.role == "assistant" and m.job_id == job_id:
                for call in m.tool_calls:
                    self.see(call, turn)
                turn += 1

    def warning(self, call: ToolCall) -> str:
        return (
            f"\n\n[clawq: you called {call.name} with the same input {self.run} times in a "
            f"row; its result will not change. Do something different, or finish: at "
            f"{2 * self.warn_at} the job is stopped.]"
        )

    def stopped(self, call: ToolCall) -> str:
        return (
            f"stopped: the model called {call.name} with the same input {self.run} times in "
            f"a row (loop_repeat_warn={self.warn_at})"
        )
