"""Forks on a real cluster: a new job in a new session from a recorded job's turn, its
files as they were after that turn (put back from write_file and edit_file checkpoints),
what exec changed left as it is and named."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Cluster, call, script, start_cluster

TURNS = [
    {"text": "1", "tool_calls": [call("t1", "write_file", path="a.txt", content="a1")]},
    {"text": "2", "tool_calls": [call("t2", "write_file", path="sub/b.txt", content="b1")]},
    {"text": "3", "tool_calls": [call("t3", "edit_file", path="a.txt", old_string="a1",
                                      new_string="a2")]},
    {"text": "4", "tool_calls": [call("t4", "exec", command="echo x >> log.txt")]},
    {"text": "5", "tool_calls": [call("t5", "write_file", path="c.txt", content="c1")]},
    {
        "text": "6",
        "tool_calls": [
            call("t6a", "edit_file", path="a.txt", old_string="a2", new_string="a3"),
            call("t6b", "write_file", path="sub/b.txt", content="b2"),
            call("t6c", "write_file", path="d.txt", content="d1"),
        ],
    },
    {
        "text": "7",
        "tool_calls": [
            call("t7a", "exec", command="echo y >> log.txt"),
            call("t7b", "write_file", path="c.txt", content="+", append=True),
            call("t7c", "edit_file", path="a.txt", old_string="a3", new_string="a4"),
        ],
    },
    {"text": "done"},
]  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster()


def files(ws: Path) -> dict[str, str]:
    return {str(p.relative_to(ws)): p.read_text() for p in sorted(ws.rglob("*")) if p.is_file()}


def test_a_fork_after_turn_5_restores_the_files_as_they_were_then(cluster: Cluster) -> None:
    ws = Path(tempfile.mkdtemp(prefix="fork-ws-"))
    original = cluster.client.submit(
        "build", workspace=str(ws), allow=["exec"], script=script(*TURNS)
    )
    assert original.wait(timeout=60).status == "completed"
    after = files(ws)
    assert after == {
        "a.txt": "a4",
        "c.txt": "c1+",
        "d.txt": "d1",
        "log.txt": "x\ny\n",
        "sub/b.txt": "b2",
    }
    # the fork reads what it finds, then ends (its script's turns count from the job's first)
    reads = [call("r1", "read_file", path="a.txt"), call("r2", "list_files", recursive=True)]
    looks = script(*[{"text": "-"}] * 5, {"tool_calls": reads}, {"text": "forked"})
    made = cluster.client.fork(original.id, 5, message="look around", script=looks)
    assert made.job_id != original.id and made.session_id == made.job_id
    result = cluster.client.job(made.job_id).wait(timeout=60)
    assert result.status == "completed" and result.final_text == "forked"
    fork_ws = Path(made.workspace)
    assert fork_ws != ws
    # as after turn 5: a.txt edited once, b.txt first version, c.txt whole, no d.txt; the
    # exec of turn 7 is not undone, and the fork says so
    assert files(fork_ws) == {"a.txt": "a2", "c.txt": "c1", "log.txt": "x\ny\n", "sub/b.txt": "b1"}
    assert sorted(made.restored) == ["a.txt", "c.txt", "sub/b.txt"] and made.removed == ["d.txt"]
    assert made.untracked == ["exec at turn 7 (t7a): exec changes are not tracked"]
    assert files(ws) == after  # the original's workspace is untouched
    # the model saw the restored file; the transcript up to turn 5 came along
    assert result.tool_calls[-2].output.rstrip().endswith("a2")
    rows = cluster.client.store.conn.execute(
        "SELECT role, content FROM messages WHERE session_id = %s ORDER BY seq", (made.session_id,)
    ).fetchall()
    assert [r["role"] for r in rows[:11]] == ["user"] + ["assistant", "tool"] * 5
    assert rows[11]["content"] == {"text": "look around"}
    assert result.iterations == 7
    row = cluster.client.store.job(made.job_id)
    assert row is not None and row["spec"]["fork"]["job_id"] == original.id


def test_a_fork_past_the_last_turn_is_refused(cluster: Cluster) -> None:
    ws = Path(tempfile.mkdtemp(prefix="fork-ws-"))
    job = cluster.client.submit("x", workspace=str(ws), script=script({"text": "only"}))
    job.wait(timeout=60)
    with pytest.raises(Exception, match="no stored turn 3"):
        cluster.client.fork(job.id, 3)
