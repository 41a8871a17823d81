"""A job parked on a person's approval survives everything (issue 31): every orchestrator
SIGKILLed, Redis and PostgreSQL killed and started again, the hot ledger in Redis lapsed
(as it does after `ledger_ttl_s`, a week: a person may answer later than that), and the
answer given long after (the clock that matters, the events' TTL, is shortened to its
floor and waited out). Then the job completes and every effect is there exactly once,
counted from the files the job's commands write, never from clawq's records.

How it failed before its parts were there: without the park (the job held in memory) the
SIGKILL lost the wait and the resumed job asked again with a new request; without the
turn's finished calls kept in PostgreSQL at the park, the lapsed hot ledger made the
resumed turn run `echo two` again (effects.txt: one, two, two, three)."""

from __future__ import annotations

import os
import signal
import time

import psycopg
import pytest
import redis

from broker.config.settings import Settings
from broker.protocol import AGENTS_QUEUE, JobSpec
from orchestrator.client import Client
from tests.chaos.harness import Chaos, _retry

pytestmark = pytest.mark.timeout(240)


def status(chaos: Chaos, job_id: str) -> str:
    def read() -> str:
        with psycopg.connect(chaos.pg.url, connect_timeout=2) as conn:
            row = conn.execute("SELECT status FROM jobs WHERE id = %s", (job_id,)).fetchone()
            return str(row[0]) if row else ""

    return str(_retry(read))


def wait_for(chaos: Chaos, job_id: str, wanted: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (now := status(chaos, job_id)) != wanted:
        assert time.monotonic() < deadline, f"job {job_id} is {now}, not {wanted}"
        time.sleep(0.2)


def test_a_parked_job_survives_every_process_and_service_and_completes_once() -> None:
    with Chaos(
        runtime_workers=1,
        concurrency=1,
        orchestrators=2,
        log_level="error",
        park_after_s=0.5,
        approval_timeout_s=0,
        events_ttl_s=60,
    ) as chaos:
        job_id = os.urandom(8).hex()
        workspace = chaos.root / job_id
        workspace.mkdir()

        def step(call_id: str, word: str) -> dict[str, object]:
            return {
                "id": call_id,
                "name": "exec",
                "input": {"command": f"echo {word} >> effects.txt"},
            }

        write = {"id": "w", "name": "write_file", "input": {"path": "ok.txt", "content": "y"}}
        turns = [
            {"tool_calls": [step("a", "one")]},
            {"tool_calls": [step("b", "two"), write]},  # two runs, then the turn waits
            {"tool_calls": [step("c", "three")]},
            {"text": "done"},
        ]
        spec = JobSpec(
            prompt="parked",
            script={"turns": turns},
            workspace=str(workspace),
            allow=["exec"],
            ask=["write_file"],
            admin=True,
        )
        chaos._create(job_id, spec)
        wait_for(chaos, job_id, "waiting", 60)
        assert (workspace / "effects.txt").read_text() == "one\ntwo\n"

        chaos.quiet.set()  # nothing restarts what is killed now
        orchestrators = [chaos.stack.procs[i] for i in chaos._indexes("orchestrator")]
        for proc in orchestrators:
            proc.send_signal(signal.SIGKILL)
        for proc in orchestrators:
            proc.wait()
        chaos.redis.kill()
        chaos.pg.crash()
        time.sleep(1.0)
        chaos.redis.start()
        chaos.pg.start()
        with redis.Redis.from_url(chaos.redis.url) as r:
            lapsed = list(r.scan_iter(f"clawq:call:{job_id}:*"))
            assert lapsed, "the turn's calls had hot ledger entries"
            r.delete(*lapsed)  # as after ledger_ttl_s
        chaos.quiet.clear()
        chaos._replaced("orchestrator", AGENTS_QUEUE, {p.pid for p in orchestrators}, 2)
        time.sleep(61)  # past the events' TTL: what Redis kept of the job is gone
        assert status(chaos, job_id) == "waiting"

        settings = Settings(redis_url=chaos.redis.url, database_url=chaos.pg.url)
        with Client(settings) as client:
            (request,) = client.requests()
            assert request.job_id == job_id and request.tool == "write_file"
            client.job(job_id).approve(request.id, "allow-once", by="reviewer")
        wait_for(chaos, job_id, "completed", 60)
        assert (workspace / "effects.txt").read_text() == "one\ntwo\nthree\n"
        assert (workspace / "ok.txt").read_text() == "y"
