"""False alarms of exec's shell check on commands agents really write
(tests/fixtures/shell/routine.json): none is refused; under confinement none is asked;
unconfined, only the lines whose write targets the line cannot say are asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.calls.permissions import decide
from orchestrator.calls.rules import Rule
from workers.confine.safety import judge_line
from workers.registry import default_registry

CORPUS = json.loads((Path(__file__).parents[1] / "fixtures/shell/routine.json").read_text())
COMMANDS: list[dict[str, object]] = CORPUS["commands"]


def test_routine_commands_are_never_refused_and_asked_only_unconfined_when_unknown(
    capsys: pytest.CaptureFixture[str],
) -> None:
    tool = default_registry().get("exec")
    assert tool is not None
    rules = [Rule.parse("exec", "allow", "job")]  # exec allowed: only its own checks decide
    outcomes: dict[str, dict[str, int]] = {"confined": {}, "unconfined": {}}
    for entry in COMMANDS:
        line = str(entry["command"])
        assert judge_line(line) is None, line
        args = tool.input_model.model_validate({"command": line})
        for where, contained in (("confined", True), ("unconfined", False)):
            decision = decide(tool, args, rules, "default", "/ws", contained=contained)
            counts = outcomes[where]
            counts[decision.behavior] = counts.get(decision.behavior, 0) + 1
            expected = "ask" if entry.get("unknown") and not contained else "allow"
            assert decision.behavior == expected, (where, line, decision.reason)
            assert decision.confined == (contained and bool(entry.get("unknown"))), line
    with capsys.disabled():
        print(f"\nroutine shell corpus: {len(COMMANDS)} commands; {outcomes}")
    assert len(COMMANDS) >= 60
    assert outcomes["confined"] == {"allow": len(COMMANDS)}
    assert outcomes["unconfined"].get("deny", 0) == 0
    assert outcomes["unconfined"]["ask"] == sum(1 for e in COMMANDS if e.get("unknown")) == 5
