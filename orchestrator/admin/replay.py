"""Replays, written once for the CLI, the API and both clients: what a replay of a recorded
job asks for (the original's spec with what the caller changes), the sandbox copy of its
workspace, and the diff of the two runs once the replay has ended.

The diff compares what each job added to its session (its turns: the model's text and
calls, and the results), its calls (where each replay call's answer came from: the ledger,
a real run, blocked, the sandbox; which of the original's calls it never made), the
decisions that changed, the final text, and the tokens and cost each tree used."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Literal

import psycopg
from pydantic import BaseModel, Field

from broker.config.settings import Settings
from broker.errors import Invalid, NotFound
from broker.protocol import JobSpec, Usage
from broker.stores.replay import RecordedCall, job_messages, recorded_calls

Effects = Literal["block", "sandbox"]


class ReplayOptions(BaseModel):
    """What a replay may change of the original (None: as the original had it)."""

    model: str | None = None
    script: dict[str, Any] | None = None
    system: str | None = None
    allow: list[str] | None = None
    ask: list[str] | None = None
    deny: list[str] | None = None
    agent: str | None = None
    effects: Effects = "block"


def replay_kwargs(original: JobSpec, options: ReplayOptions) -> dict[str, Any]:
    """`Client.submit`'s keywords for the replay of a job with this spec."""
    model = options.model or original.model
    script = options.script if options.script is not None else original.script
    if model.partition(":")[0] != "scripted":
        script = None
    return {
        "workspace": original.workspace,
        "model": model,
        "script": script,
        "allow": original.allow if options.allow is None else options.allow,
        "ask": original.ask if options.ask is None else options.ask,
        "deny": original.deny if options.deny is None else options.deny,
        "permission_mode": original.permission_mode,
        "agent": options.agent or original.agent_id,
        "max_iterations": original.max_iterations,
        "system": original.system if options.system is None else options.system,
        "budget": original.budget.model_dump() if original.budget else None,
    }


def original_spec(row: dict[str, Any] | None, job_id: str) -> JobSpec:
    if row is None:
        raise NotFound(f"no job {job_id}")
    spec = JobSpec.model_validate(row["spec"])
    if spec.depth > 0:
        raise Invalid(f"job {job_id} is a subagent: replay its root job")
    return spec


def sandbox_copy(settings: Settings, workspace: str, job_id: str) -> str:
    """A copy of the workspace as it is now, for the replay's divergent calls to run in
    (private to its owner: 0700)."""
    root = settings.replay_sandbox_dir or os.path.join(tempfile.gettempdir(), "clawq-replays")
    os.makedirs(root, mode=0o700, exist_ok=True)
    target = os.path.join(root, job_id)
    if os.path.isdir(workspace):
        shutil.copytree(workspace, target, symlinks=True)
    else:
        os.makedirs(target)
    os.chmod(target, 0o700)
    return target


# -- the diff ----------------------------------------------------------------------------


class Pair(BaseModel):
    original: Any
    replay: Any
    same: bool


class TurnDiff(BaseModel):
    turn: int  # 1-based
    same: bool
    original: str = ""  # what the model said and called, in a line; '' for no such turn
    replay: str = ""


class CallDiff(BaseModel):
    turn: int  # 1-based, of the job it is in (the replay's; the original's when not made)
    index: int
    call_id: str
    name: str
    summary: str
    # ledger | ran | blocked | sandbox | refused (by the replay's gate) | not made (by the
    # replay: the original's call the replay never made)
    source: str
    original: list[int] | None = None  # [turn, index] of the original's call it repeats
    decision: Pair | None = None
    is_error: Pair | None = None


class ReplayDiff(BaseModel):
    original_id: str
    replay_id: str
    status: Pair
    identical: bool = Field(description="the same turns, results and final text")
    diverged_at: int | None = Field(None, description="the first turn (1-based) that differs")
    divergence: str = ""
    turns: list[TurnDiff]
    calls: list[CallDiff]
    sources: dict[str, int]
    tools_run: int = Field(description="replay calls that ran on a worker")
    decisions: list[CallDiff] = Field(description="calls whose decision changed")
    final_text: Pair
    tokens: Pair
    cost_usd: Pair
    iterations: Pair


def _summary(name: str, input_: dict[str, Any], width: int = 60) -> str:
    text = json.dumps(input_, ensure_ascii=False, separators=(",", ":"))
    return f"{name}({text[:width]}{'…' if len(text) > width else ''})"


def _turns(messages: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(the model's message, its results or {}) per turn, in order."""
    turns: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for m in messages:
        if m["role"] == "assistant":
            turns.append((m["content"] or {}, {}))
        elif m["role"] == "tool" and turns:
            turns[-1] = (turns[-1][0], m["content"] or {})
    return turns


def _turn_line(content: dict[str, Any]) -> str:
    calls = [_summary(c["name"], c.get("input") or {}) for c in content.get("tool_calls", [])]
    text = (content.get("text") or "").strip().replace("\n", " ")
    return " ".join(p for p in (text[:80], ", ".join(calls)) if p)


def _pair_calls(
    original: list[RecordedCall], replay: list[RecordedCall]
) -> dict[tuple[int, int], RecordedCall]:
    """Each replay call's counterpart in the original: the one it was answered from, else
    the same call at the same place, else the same call anywhere not yet paired."""
    by_pos = {(c.turn, c.seq): c for c in original}
    paired: dict[tuple[int, int], RecordedCall] = {}
    used: set[tuple[int, int]] = set()
    for c in replay:
        of = (c.metadata.get("replay") or {}).get("of")
        if of and tuple(of) in by_pos:
            paired[(c.turn, c.seq)] = by_pos[(of[0], of[1])]
            used.add((of[0], of[1]))
    for c in replay:
        if (c.turn, c.seq) in paired:
            continue
        here = by_pos.get((c.turn, c.seq))
        options = [here] if here is not None and here.content == c.content else []
        options += [o for o in original if o.content == c.content]
        for o in options:
            if (o.turn, o.seq) not in used:
                paired[(c.turn, c.seq)] = o
                used.add((o.turn, o.seq))
                break
    return paired


def _source(call: RecordedCall) -> str:
    source = (call.metadata.get("replay") or {}).get("source")
    if source:
        return str(source)
    return "refused" if call.decision.startswith("deny:") else "ran"


def _usage(u: Usage | None) -> tuple[int, float]:
    return (u.tokens, u.cost_usd) if u else (0, 0.0)


def diff(
    conn: psycopg.Connection[Any],
    original: dict[str, Any],
    replay: dict[str, Any],
    usages: tuple[Usage | None, Usage | None],
) -> ReplayDiff:
    """The diff of a replay (`replay`: its job row) against its original (its row)."""
    o_id, r_id = original["id"], replay["id"]
    o_turns, r_turns = _turns(job_messages(conn, o_id)), _turns(job_messages(conn, r_id))
    turns: list[TurnDiff] = []
    diverged: int | None = None
    for n in range(max(len(o_turns), len(r_turns))):
        o_turn = o_turns[n] if n < len(o_turns) else None
        r_turn = r_turns[n] if n < len(r_turns) else None
        same = o_turn == r_turn
        turns.append(
            TurnDiff(
                turn=n + 1,
                same=same,
                original=_turn_line(o_turn[0]) if o_turn else "",
                replay=_turn_line(r_turn[0]) if r_turn else "",
            )
        )
        if not same and diverged is None:
            diverged = n + 1
    o_calls, r_calls = recorded_calls(conn, o_id), recorded_calls(conn, r_id)
    paired = _pair_calls(o_calls, r_calls)
    calls: list[CallDiff] = []
    for c in r_calls:
        o = paired.get((c.turn, c.seq))
        calls.append(
            CallDiff(
                turn=c.turn + 1,
                index=c.seq,
                call_id=c.call_id,
                name=c.name,
                summary=_summary(c.name, c.input),
                source=_source(c),
                original=[o.turn + 1, o.seq] if o else None,
                decision=Pair(original=o.decision, replay=c.decision, same=o.decision == c.decision)
                if o
                else None,
                is_error=Pair(original=o.is_error, replay=c.is_error, same=o.is_error == c.is_error)
                if o
                else None,
            )
        )
    taken = {(o.turn, o.seq) for o in paired.values()}
    for left in o_calls:
        if (left.turn, left.seq) not in taken:
            calls.append(
                CallDiff(
                    turn=left.turn + 1,
                    index=left.seq,
                    call_id=left.call_id,
                    name=left.name,
                    summary=_summary(left.name, left.input),
                    source="not made",
                )
            )
    sources: dict[str, int] = {}
    for each in calls:
        sources[each.source] = sources.get(each.source, 0) + 1
    decisions = [d for d in calls if d.decision is not None and not d.decision.same]
    (o_tokens, o_cost), (r_tokens, r_cost) = _usage(usages[0]), _usage(usages[1])
    final = Pair(
        original=original["final_text"],
        replay=replay["final_text"],
        same=original["final_text"] == replay["final_text"],
    )
    return ReplayDiff(
        original_id=o_id,
        replay_id=r_id,
        status=Pair(
            original=original["status"],
            replay=replay["status"],
            same=original["status"] == replay["status"],
        ),
        identical=diverged is None and final.same,
        diverged_at=diverged,
        divergence=_divergence(turns, diverged, calls),
        turns=turns,
        calls=calls,
        sources=sources,
        tools_run=sum(1 for c in calls if c.source in ("ran", "sandbox")),
        decisions=decisions,
        final_text=final,
        tokens=Pair(original=o_tokens, replay=r_tokens, same=o_tokens == r_tokens),
        cost_usd=Pair(original=o_cost, replay=r_cost, same=o_cost == r_cost),
        iterations=Pair(
            original=original["iterations"],
            replay=replay["iterations"],
            same=original["iterations"] == replay["iterations"],
        ),
    )


def _divergence(turns: list[TurnDiff], at: int | None, calls: list[CallDiff]) -> str:
    """The divergence in words: the turn, what each run's model did there, and what became
    of the replay's new calls at that turn."""
    if at is None:
        return ""
    t = turns[at - 1]
    if t.original == t.replay:
        said = f"turn {at}: the same calls, different results"
    else:
        before, now = t.original or "had ended", t.replay or "had ended"
        said = f"turn {at}: the original {before}; the replay {now}"
    new = [
        c for c in calls if c.turn == at and c.source in ("ran", "blocked", "sandbox", "refused")
    ]
    if new:
        said += "; " + ", ".join(f"{c.summary} {c.source}" for c in new)
    return said
