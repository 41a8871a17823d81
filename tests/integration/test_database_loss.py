"""PostgreSQL kills the orchestrator's connection in the middle of a transcript write: the
job is not failed for it, nor paused. The write is sent again on a new connection (every
statement of it is idempotent) and the job goes on; its call ran once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.integration.conftest import Cluster, call, script, start_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:  # its own: a backend of its orchestrator is killed
    yield from start_cluster()


def test_a_job_outlives_a_transcript_write_killed_by_the_database(
    cluster: Cluster, workspace: Path
) -> None:
    job = cluster.client.submit(
        "cut",
        workspace=str(workspace),
        allow=["exec"],
        script=script(
            {"tool_calls": [call("s", "exec", command="sleep 2; echo ran >> runs.txt; echo ok")]},
            {"text": "done"},
        ),
    )
    deadline = time.monotonic() + 30
    while not any(e.type == "tool_call_queued" for e in job.events()):
        assert time.monotonic() < deadline, "the call was never queued"
        time.sleep(0.05)
    time.sleep(0.5)  # the turn's own write is done
    # the write of the call's result (with the model's next message) waits on this lock
    with (
        psycopg.connect(cluster.iso.database_url, autocommit=True) as admin,
        admin.transaction(),
    ):
        admin.execute("LOCK TABLE messages IN ACCESS EXCLUSIVE MODE")
        blocked = None
        while blocked is None:
            assert time.monotonic() < deadline + 30, "no write waited on the lock"
            blocked = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND pid <> pg_backend_pid() AND datname = current_database()"
            ).fetchone()
            time.sleep(0.05)
        admin.execute("SELECT pg_terminate_backend(%s)", (blocked[0],))
    result = job.wait(timeout=90)
    assert result.status == "completed", result.error
    assert result.final_text == "done"
    (only,) = result.tool_calls
    assert not only.is_error and only.output.startswith("ok")
    assert (workspace / "runs.txt").read_text() == "ran\n"  # run once
    started = [e for e in job.events() if e.type == "job_started"]
    assert len(started) == 1  # written again in place: not let go and resumed
