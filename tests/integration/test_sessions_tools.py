"""The sessions tools read the transcripts through a real `sessions` worker."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
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
    # Reads start while the model still streams, but what reads the transcript is held until
    # the turn is stored: it sees the turn's own message (#3, with its three calls) and the
    # previous turn's result, which that write carries
    seen = re.search(r"1 jobs, (\d+) messages, (\d+) tool calls", by_id["st"].output)
    assert seen and (int(seen[1]), int(seen[2])) == (4, 4), by_id["st"].output
    history = by_id["hi"].output.splitlines()
    assert history[0] == "#0 user: look back"
    assert history[1].startswith("#1 assistant: noting write_file(")
    assert history[2] == "#2 tool: write_file → wrote 1 bytes to n.txt"
    assert len(history) == 4, history
    assert history[3].startswith("#3 assistant:") and "session_status({})" in history[3]
    final = cluster.client.store.session_status(job.id)
    assert final and (final["jobs"], final["messages"], final["tool_calls"]) == (1, 6, 4)
    listed = by_id["ls"].output
    assert job.id in listed and earlier.id in listed and "'an earlier task'" in listed


LOCKED_S = 1.5  # the job's row held in PostgreSQL: the second turn's write waits this long


def test_a_history_read_waits_for_a_slow_transcript_write(
    cluster: Cluster, workspace: Path
) -> None:
    """The second turn is stored slowly (another transaction holds the job's row, which
    its write updates): the history read it streams waits for that write, and sees the
    turn and the first turn's result the write carries. A read that did not wait would
    run in the meantime and see two messages."""
    job = cluster.client.submit(
        "look back, slowly",
        workspace=str(workspace),
        ask=["write_file"],  # the job waits for a person, which lets the lock be taken
        script={
            "turns": [
                {
                    "tool_calls": [
                        {
                            "id": "w",
                            "name": "write_file",
                            "input": {"path": "m.txt", "content": "y"},
                        }
                    ]
                },
                {"tool_calls": [{"id": "hi", "name": "sessions_history", "input": {}}]},
                {"text": "done"},
            ]
        },
    )
    request_id = next(e.data["request_id"] for e in job.events() if e.type == "approval_requested")
    with psycopg.connect(cluster.iso.database_url) as lock:
        # (not FOR UPDATE: a key share, as a foreign key's check takes, still passes)
        lock.execute("SELECT 1 FROM jobs WHERE id = %s FOR NO KEY UPDATE", (job.id,))
        approving = threading.Thread(target=job.approve, args=(request_id, "allow-once"))
        approving.start()
        time.sleep(LOCKED_S)
        lock.commit()
    approving.join(30)
    result = job.wait(timeout=60)
    by_id = {c.id: c for c in result.tool_calls}
    assert not any(c.is_error for c in result.tool_calls), result.tool_calls
    history = by_id["hi"].output.splitlines()
    assert len(history) == 4, history
    assert history[2] == "#2 tool: write_file → wrote 1 bytes to m.txt"
    assert history[3].startswith("#3 assistant:") and "sessions_history({})" in history[3]
