"""The sessions tools read the transcripts through a real `sessions` worker."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Cluster, start_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(groups=("fs", "sessions"))


def test_status_history_and_list(cluster: Cluster, workspace: Path) -> None:
    earlier = cluster.client.submit(
        "an earlier task", workspace=str(workspace), script={"turns": [{"text": "earlier done"}]}
    )
    earlier.wait(timeout=60)
    job = cluster.client.submit(
        "look back",
        workspace=str(workspace),
        script={
            "turns": [
                {
                    "text": "noting",
                    "tool_calls": [
                        {
                            "id": "w",
                            "name": "write_file",
                            "input": {"path": "n.txt", "content": "x"},
                        }
                    ],
                },
                {
                    "tool_calls": [
                        {"id": "st", "name": "session_status", "input": {}},
                        {"id": "hi", "name": "sessions_history", "input": {}},
                        {"id": "ls", "name": "sessions_list", "input": {}},
                    ]
                },
                {"text": "done"},
            ]
        },
    )
    result = job.wait(timeout=60)
    by_id = {c.id: c for c in result.tool_calls}
    assert not any(c.is_error for c in result.tool_calls), result.tool_calls
    assert by_id["st"].queue == "sessions"
    # Calls start while the model still streams, so the turn's own assistant message (#3,
    # with its three calls) may or may not be stored yet; everything before it is.
    seen = re.search(r"1 jobs, (\d+) messages, (\d+) tool calls", by_id["st"].output)
    assert seen and (int(seen[1]), int(seen[2])) in {(3, 1), (4, 4)}, by_id["st"].output
    history = by_id["hi"].output.splitlines()
    assert history[0] == "#0 user: look back"
    assert history[1].startswith("#1 assistant: noting write_file(")
    assert history[2] == "#2 tool: write_file → wrote 1 bytes to n.txt"
    assert len(history) in (3, 4)  # run beside session_status: either may see #3 first
    if len(history) == 4:
        assert history[3].startswith("#3 assistant:") and "session_status({})" in history[3]
    final = cluster.client.store.session_status(job.id)
    assert final and (final["jobs"], final["messages"], final["tool_calls"]) == (1, 6, 4)
    listed = by_id["ls"].output
    assert job.id in listed and earlier.id in listed and "'an earlier task'" in listed
