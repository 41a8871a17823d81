"""Tree-wide budgets through a real stack: a turn limit stops a job before the model is
asked again; a token budget shared by a parent and its subagent (tokens as the scripted
model reports them, as a provider would) ends the parent `budget_exceeded` and cancels its
child; the usage is in the JobResult."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Cluster, call, script, start_cluster, wait_until


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(groups=("fs", "runtime", "sessions"))


def listing(n: int) -> dict[str, object]:
    return {"tool_calls": [call(f"l{n}", "list_files", path=".")]}


def test_a_turn_budget_stops_before_the_next_model_turn(cluster: Cluster, workspace: Path) -> None:
    job = cluster.client.submit(
        "loop",
        workspace=str(workspace),
        budget={"turns": 2},
        script=script(listing(1), listing(2), listing(3), {"text": "never reached"}),
    )
    result = job.wait(timeout=60)
    assert result.status == "budget_exceeded", result
    assert "budget of model turns" in result.error
    assert len(result.tool_calls) == 2  # the third turn was never asked for
    assert result.usage is not None and result.usage.turns == 2  # the refused one is not
    assert any(e.type == "budget_exceeded" for e in job.events())


def test_a_tree_over_its_token_budget_ends_and_its_child_is_cancelled(
    cluster: Cluster, workspace: Path
) -> None:
    usage = {"input": 40, "output": 10}
    # the parent's calls differ from turn to turn (the same one in a row is a loop)
    # the child spends nothing and sits in one long call when the parent goes over: only
    # the parent's end can stop it there (its own budget check comes at its next turn,
    # which would end it budget_exceeded, not cancelled)
    child = {
        "turns": [
            {
                "usage": {"input": 0, "output": 0},
                "tool_calls": [call("c", "exec", command="sleep 60")],
            },
            {"text": "child done"},
        ]
    }
    parent = cluster.client.submit(
        "spend",
        workspace=str(workspace),
        allow=["exec"],
        budget={"tokens": 400},
        script={
            "turns": [
                {"usage": usage, "tool_calls": [call("s", "spawn", task="work", label="w")]},
                *[
                    {
                        "usage": usage,
                        "tool_calls": [call(f"p{n}", "exec", command=f"sleep 0.2{n % 10}")],
                    }
                    for n in range(30)
                ],
                {"text": "parent done"},
            ],
            "subagents": {"w": child},
        },
    )
    result = parent.wait(timeout=120)
    assert result.status == "budget_exceeded", result
    assert "budget of tokens" in result.error
    assert result.usage is not None and result.usage.tokens > 400
    assert result.usage.tokens <= 400 + 50  # one reply over it; the child spent nothing
    wait_until(
        lambda: parent.subagents() and parent.subagents()[0].status not in ("queued", "running"),
        50,  # well before its sleep 60 would end
        "the child stopped",
    )
    (kid,) = parent.subagents()
    assert kid.status == "cancelled", kid


@pytest.fixture(scope="module")
def two() -> Iterator[Cluster]:
    yield from start_cluster(
        groups=("fs", "runtime", "sessions"), orchestrators=2, max_concurrent_subagents=8
    )


def test_a_ten_turn_budget_holds_for_a_tree_across_two_orchestrators(
    two: Cluster, workspace: Path
) -> None:
    """A parent and two children that would each take 30 turns: the tree is asked for
    exactly 10 model turns in all, then every job of it ends and nothing is left running."""
    busy = {
        "turns": [
            {"tool_calls": [call(f"x{n}", "exec", command=f"sleep 0.2{n % 10}")]} for n in range(30)
        ]
        + [{"text": "finished"}]
    }
    parent = two.client.submit(
        "fan out",
        workspace=str(workspace),
        allow=["exec"],
        budget={"turns": 10},
        script={
            "turns": [
                {
                    "tool_calls": [
                        call("a", "spawn", task="one", label="a"),
                        call("b", "spawn", task="two", label="b"),
                    ]
                },
                *busy["turns"],
            ],
            "subagents": {"*": busy},
        },
    )
    result = parent.wait(timeout=120)
    assert result.status == "budget_exceeded", result
    wait_until(
        lambda: (
            len(parent.subagents()) == 2
            and all(k.status in ("cancelled", "budget_exceeded") for k in parent.subagents())
        ),
        60,
        "every child stopped",
    )
    rows = two.client.store.conn.execute(
        "SELECT id, status, iterations, orchestrator FROM jobs WHERE id = %s OR root_id = %s",
        (parent.id, parent.id),
    ).fetchall()
    assert len(rows) == 3
    # model turns asked, tree-wide, whichever of the two orchestrators ran each job
    assert sum(r["iterations"] for r in rows) == 10, rows
