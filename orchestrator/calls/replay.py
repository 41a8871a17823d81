"""The replay layer of a call's path: in a job that replays a recorded one, a call the
gate allowed is answered from the original's ledger when the original made it, and runs
nothing. Matching is by position first (the same turn and place in it, the same tool and
input), then by content (the same tool and input anywhere not yet used).

A call the original never made (a divergence) runs for real when its tool only reads
(`SideEffect.read`, the tool's own declaration); one with an effect is answered "not run
in a replay", unless the replay runs its effects in a sandbox: then every divergent call
runs against the copy of the workspace made when the replay was submitted.

Each outcome says where it came from in its metadata (`replay.source`: ledger, ran,
blocked, sandbox), which the replay's diff reads. The dispatcher knows none of this."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.protocol import CallOutcome, ReplayOf
from broker.stores.replay import RecordedCall, content_key, recorded_calls_async
from orchestrator.calls.gate import Ready
from workers.tool import SideEffect

if TYPE_CHECKING:
    from orchestrator.job.calls import JobCalls


def blocked_text(name: str) -> str:
    return (
        f"{name} was not run in a replay: the original job never made this call and it has "
        "an effect (replay with --effects sandbox to run it against a copy of the workspace)"
    )


@dataclass
class Replay:
    of: ReplayOf
    by_position: dict[tuple[int, int], RecordedCall] = field(default_factory=dict)
    by_content: dict[str, list[RecordedCall]] = field(default_factory=lambda: defaultdict(list))
    used: set[tuple[int, int]] = field(default_factory=set)

    @classmethod
    def of_calls(
        cls,
        of: ReplayOf,
        recorded: list[RecordedCall],
        mine: list[RecordedCall] = (),  # type: ignore[assignment]
    ) -> Replay:
        """The layer over the original's ledger; `mine`: what this replay already
        recorded (a resumed replay does not use a recorded call twice)."""
        replay = cls(of)
        for call in recorded:
            if call.ran:
                replay.by_position[(call.turn, call.seq)] = call
                replay.by_content[call.content].append(call)
        for call in mine:
            source = call.metadata.get("replay") or {}
            if source.get("source") == "ledger" and len(source.get("of") or []) == 2:
                replay.used.add((int(source["of"][0]), int(source["of"][1])))
        return replay

    @classmethod
    async def load(cls, pool: Any, of: ReplayOf, job_id: str) -> Replay:
        return cls.of_calls(
            of,
            await recorded_calls_async(pool, of.job_id),
            await recorded_calls_async(pool, job_id),
        )

    def match(
        self, turn: int, index: int, name: str, input_: dict[str, Any]
    ) -> RecordedCall | None:
        """The recorded call this one repeats, taken (each answers once); None: none."""
        key = content_key(name, input_)
        here = self.by_position.get((turn, index))
        candidates = [here] if here is not None and here.content == key else []
        candidates += self.by_content.get(key, [])
        for call in candidates:
            if (call.turn, call.seq) not in self.used:
                self.used.add((call.turn, call.seq))
                return call
        return None

    async def through(self, run: JobCalls, turn: int, index: int, ready: Ready) -> CallOutcome:
        """The call's outcome in a replay: from the ledger, run, blocked, or sandboxed."""
        found = self.match(turn, index, ready.call.name, ready.call.input)
        if found is not None:
            return self.answered(run, turn, ready, found)
        if self.of.effects == "sandbox" and self.of.sandbox:
            outcome = await run.send(turn, ready, workspace=self.of.sandbox)
            return mark(outcome, "sandbox")
        if ready.tool.side_effect is SideEffect.read:
            return mark(await run.send(turn, ready), "ran")
        text = blocked_text(ready.call.name)
        d = ready.decision
        return CallOutcome(
            call_id=ready.call.id,
            job_id=run.job_id,
            turn=turn,
            for_llm=text,
            for_user=text,
            is_error=True,
            worker="replay",
            attempts=0,
            metadata={"replay": {"source": "blocked"}},
            decision=f"allow:{d.layer}",
            decided_by=d.by,
            decision_reason=d.reason,
        )

    def answered(self, run: JobCalls, turn: int, ready: Ready, found: RecordedCall) -> CallOutcome:
        """The recorded outcome, as it was (its post-tool hooks' words included), under
        this call's id and this run's decision; nothing of it ran here."""
        metadata = {k: v for k, v in found.metadata.items() if k not in ("checkpoint", "replay")}
        d = ready.decision
        return CallOutcome(
            call_id=ready.call.id,
            job_id=run.job_id,
            turn=turn,
            for_llm=found.for_llm,
            for_user=found.for_user,
            is_error=found.is_error,
            metadata=metadata
            | {
                "replay": {"source": "ledger", "of": [found.turn, found.seq], "call": found.call_id}
            },
            queue=found.queue,
            worker="ledger",
            attempts=0,
            decision=f"allow:{d.layer}",
            decided_by=d.by,
            decision_reason=d.reason,
        )


def mark(outcome: CallOutcome, source: str) -> CallOutcome:
    return outcome.model_copy(
        update={"metadata": outcome.metadata | {"replay": {"source": source}}}
    )
