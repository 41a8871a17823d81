"""A cancel or steer heard on the control channel reaches a job however early it comes:
even between the job's acceptance and its task's first step (a task cancelled before its
first step never runs, nor the cleanup that ends the job). An orchestrator in this process,
on a real Redis and PostgreSQL; no worker is needed, the scripted job ends before it calls.

Before the fix, a child cancelled by its parent the moment it was spawned stayed running
and leased for good (CI: tests/integration/test_subagents.py, "still stopping: d")."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import redis

from broker import keys
from broker.pg.store import Store
from broker.protocol import JobSpec
from broker.redis.control import cancel_jobs
from orchestrator.engine import Orchestrator
from tests.conftest import Isolated

ENDS_WITHIN_S = 20.0


def create(isolated: Isolated, workspace: Path) -> str:
    job_id = uuid.uuid4().hex
    spec = JobSpec(
        prompt="start",
        workspace=str(workspace),
        admin=True,
        script={"turns": [{"text": "first reply"}, {"text": "second reply"}]},
    )
    store = Store(isolated.database_url)
    try:
        store.create_job(job_id, session_id=job_id, spec=spec)
    finally:
        store.close()
    return job_id


async def accept_then_hear(isolated: Isolated, job_id: str, command: dict[str, str]) -> None:
    """Accept the job and hand the command to the orchestrator in the same step of its event
    loop: the job's task exists and has not run yet. Returns once the job's task is over."""
    orchestrator = Orchestrator(isolated.settings)
    stop = asyncio.Event()
    running = asyncio.create_task(orchestrator.run(stop))
    try:
        while not hasattr(orchestrator, "agent_queue"):  # its services are up
            await asyncio.sleep(0.05)
        assert await orchestrator.accept(job_id)
        orchestrator.on_control(command)  # no await in between: the task has not begun
        task = orchestrator.jobs[job_id]
        await asyncio.wait([task], timeout=ENDS_WITHIN_S)
        assert not task.cancelled(), "cancelled before it began: the job never ends"
        assert task.done() and job_id not in orchestrator.jobs
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)


def test_a_cancel_heard_before_the_jobs_first_step_ends_it(
    isolated: Isolated, workspace: Path
) -> None:
    job_id = create(isolated, workspace)
    with redis.Redis.from_url(isolated.redis_url) as client:
        cancel_jobs(client, [job_id], "cancelled by its parent", 60)  # the flag, and the push
        asyncio.run(accept_then_hear(isolated, job_id, {"cancel": job_id}))
        assert not client.exists(keys.lease(job_id))
    store = Store(isolated.database_url)
    try:
        row = store.job(job_id)
        assert row is not None and row["status"] == "cancelled", row
        assert row["error"] == "cancelled by request"
    finally:
        store.close()


def test_a_steer_heard_before_the_jobs_first_step_is_its_first_turns_input(
    isolated: Isolated, workspace: Path
) -> None:
    job_id = create(isolated, workspace)
    with redis.Redis.from_url(isolated.redis_url) as client:
        client.rpush(keys.steer(job_id), "do the other thing")  # as `Job.steer` does
        asyncio.run(accept_then_hear(isolated, job_id, {"steer": job_id}))
    store = Store(isolated.database_url)
    try:
        row = store.job(job_id)
        assert row is not None and row["status"] == "completed", row
        assert row["final_text"] == "first reply", row
        users = [r["content"]["text"] for r in store.transcript(job_id, 20) if r["role"] == "user"]
        assert users == ["start", "do the other thing"], users
    finally:
        store.close()
