"""The replay layer's matching, alone: by position first, then by content, each recorded
call answering once; refusals, stops and blocked calls never answer."""

from __future__ import annotations

from typing import Any

from broker.protocol import ReplayOf
from broker.stores.replay import RecordedCall, fork_point
from orchestrator.calls.replay import Replay


def rec(turn: int, seq: int, name: str, **more: Any) -> RecordedCall:
    return RecordedCall(turn=turn, seq=seq, call_id=f"c{turn}.{seq}", name=name, **more)


def test_a_call_matches_its_place_first_then_its_content_once() -> None:
    recorded = [
        rec(0, 0, "read_file", input={"path": "a"}, for_llm="first"),
        rec(1, 0, "read_file", input={"path": "a"}, for_llm="second"),
        rec(1, 1, "exec", input={"command": "ls"}),
    ]
    replay = Replay.of_calls(ReplayOf(job_id="j"), recorded)
    # at turn 1 place 0 the same read: its own record, not the first one with that content
    assert replay.match(1, 0, "read_file", {"path": "a"}).for_llm == "second"  # type: ignore[union-attr]
    # elsewhere the same read takes the one left, then none is left
    assert replay.match(5, 3, "read_file", {"path": "a"}).for_llm == "first"  # type: ignore[union-attr]
    assert replay.match(0, 0, "read_file", {"path": "a"}) is None
    # content is canonical: key order does not matter; another input does
    assert replay.match(1, 1, "exec", {"command": "ls"}) is not None
    assert replay.match(1, 1, "exec", {"command": "ls -l"}) is None


def test_what_never_ran_answers_nothing() -> None:
    recorded = [
        rec(0, 0, "exec", input={"command": "a"}, decision="deny:rule"),
        rec(0, 1, "exec", input={"command": "b"}, metadata={"cancelled": True}),
        rec(0, 2, "write_file", input={"path": "x"}, metadata={"replay": {"source": "blocked"}}),
        rec(0, 3, "exec", input={"command": "c"}, status="queued"),
    ]
    replay = Replay.of_calls(ReplayOf(job_id="j"), recorded)
    assert all(replay.match(0, c.seq, c.name, c.input) is None for c in recorded)


def test_a_resumed_replay_does_not_use_a_record_twice() -> None:
    recorded = [rec(0, 0, "read_file", input={"path": "a"})]
    mine = [rec(0, 0, "read_file", metadata={"replay": {"source": "ledger", "of": [0, 0]}})]
    replay = Replay.of_calls(ReplayOf(job_id="j"), recorded, mine)
    assert replay.match(0, 0, "read_file", {"path": "a"}) is None


def test_a_fork_point_is_after_the_turns_results() -> None:
    def m(seq: int, role: str, job: str = "j", calls: bool = False) -> dict[str, Any]:
        content = {"tool_calls": [{"id": "x", "name": "exec"}]} if calls else {"text": "t"}
        return {"seq": seq, "role": role, "content": content, "job_id": job}

    messages = [
        m(0, "user", "earlier"), m(1, "assistant", "earlier"),  # another job of the session
        m(2, "user"), m(3, "assistant", calls=True), m(4, "tool"), m(5, "assistant"),
    ]  # fmt: skip
    assert fork_point(messages, "j", 1) == 4
    assert fork_point(messages, "j", 2) == 5
    assert fork_point(messages, "j", 3) == -1
