"""A `direct` worker (the default pool): N processes that each take their own calls, with
prefork's time limits and prefork's replacement of a process that died."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from broker import keys
from broker.config.settings import Settings
from broker.protocol import CallContext, CallEnvelope, CallOutcome
from broker.redis.presence import live_processes
from orchestrator.calls.dispatch import running_dispatcher
from tests.conftest import Isolated
from tests.integration.conftest import wait_until

GRACE_S = 1.0  # soft limit: a call's timeout + 1 s; hard limit: + 2 s


@pytest.fixture
def worker() -> Iterator[tuple[Isolated, subprocess.Popen[bytes]]]:
    iso = Isolated(tool_grace_s=GRACE_S, heartbeat_interval_s=0.5, heartbeat_ttl_s=3)
    env = {
        **os.environ,
        **iso.env(),
        "CLAWQ_TOOL_GRACE_S": str(GRACE_S),
        "CLAWQ_HEARTBEAT_INTERVAL_S": "0.5",
        "CLAWQ_HEARTBEAT_TTL_S": "3",
    }
    proc = subprocess.Popen([sys.executable, "-m", "tests.stall_worker", "2", "direct"], env=env)
    try:
        wait_until(lambda: len(pids(iso)) == 2, what="two worker processes heartbeating")
        yield iso, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)
        iso.drop()


def pids(iso: Isolated) -> set[int]:
    with redis.Redis.from_url(iso.redis_url) as client:
        return {int(p["pid"]) for p in live_processes(client) if p.get("queue") == "fs"}


def call(
    iso: Isolated,
    call_id: str,
    timeout_s: float,
    settings: Settings | None = None,
    **input_: Any,
) -> CallOutcome:
    """One `stall` call through a dispatcher and its watchdog (`settings`: the
    dispatcher's, when not the worker's)."""

    async def go() -> CallOutcome:
        async with running_dispatcher(settings or iso.settings, f"test-{call_id}") as dispatcher:
            watchdog = asyncio.create_task(dispatcher.watchdog())  # resends a killed call
            try:
                envelope = CallEnvelope(
                    call_id=call_id,
                    job_id="j",
                    turn=0,
                    session_id="s",
                    tool="stall",
                    input=input_,
                    context=CallContext(workspace="/tmp"),
                    timeout_s=timeout_s,
                    deadline=time.time() + 120,
                    reply_to=dispatcher.reply_key,
                    max_deliveries=2,
                )
                return await asyncio.wait_for(dispatcher.call(envelope, "fs"), 90)
            finally:
                watchdog.cancel()

    return asyncio.run(go())


def test_calls_run_in_the_processes_themselves(worker: tuple[Isolated, Any]) -> None:
    iso, _ = worker
    outcomes = [call(iso, f"quick{i}", 5, seconds=0) for i in range(6)]
    assert all(o.for_llm == "slept" and not o.is_error for o in outcomes)
    # the process that ran a call is one of the two heartbeating ones, not a child of theirs
    ran = {int(o.worker.rsplit(":", 1)[1]) for o in outcomes}
    assert ran <= pids(iso)


def test_the_soft_limit_stops_the_call_and_the_process_goes_on(
    worker: tuple[Isolated, Any],
) -> None:
    iso, _ = worker
    before = pids(iso)
    started = time.monotonic()
    outcome = call(iso, "soft", 0.5, seconds=30)  # soft limit at 1.5 s
    assert outcome.is_error and "SoftTimeLimitExceeded" in outcome.for_llm, outcome.for_llm
    assert time.monotonic() - started < 10
    assert outcome.attempts == 1
    assert pids(iso) == before  # nobody died
    after = call(iso, "after-soft", 5, seconds=0)
    assert after.for_llm == "slept"


def test_the_hard_limit_kills_the_process_and_another_takes_its_place(
    worker: tuple[Isolated, Any], tmp_path: Path
) -> None:
    iso, _ = worker
    before = pids(iso)
    # swallows the soft limit: killed at the hard limit (2.5 s), sent again, killed again;
    # the first delivery, a read, ran before any claim: its death counts all the same
    runs = tmp_path / "runs"
    outcome = call(iso, "hard", 0.5, seconds=30, ignore_soft_limit=True, runs=str(runs))
    assert outcome.is_error and "died 2 times" in outcome.for_llm, outcome.for_llm
    assert len(runs.read_text().split()) == 2  # max_deliveries, not one more
    now = wait_until(lambda: (found := pids(iso)) and len(found) == 2 and found, what="two again")
    assert len(before - now) >= 1  # the killed processes were replaced by new ones
    assert call(iso, "after-hard", 5, seconds=0).for_llm == "slept"


def test_a_read_running_before_its_claim_is_taken_not_waiting(
    worker: tuple[Isolated, Any],
) -> None:
    """A read runs first and is claimed with its outcome. Running longer than the waits
    for a worker, it is still held by a live process: neither announced as waiting nor
    answered as never taken."""
    iso, _ = worker
    impatient = iso.settings.model_copy(
        update={"call_waiting_after_s": 1.0, "schedule_to_start_timeout_s": 2.0}
    )
    outcome = call(iso, "long-read", 10, impatient, seconds=4)
    assert (outcome.for_llm, outcome.is_error, outcome.attempts) == ("slept", False, 1)
    with redis.Redis.from_url(iso.redis_url) as client:
        assert client.hlen(keys.CALLS_WAITING) == 0
        assert not any(
            b"tool_call_waiting" in fields[b"e"] for _, fields in client.xrange(keys.events("j"))
        )


def test_a_killed_process_is_replaced_and_a_stop_ends_them_all(
    worker: tuple[Isolated, subprocess.Popen[bytes]],
) -> None:
    iso, proc = worker
    first, second = sorted(pids(iso))
    os.kill(first, signal.SIGKILL)
    wait_until(
        lambda: (found := pids(iso)) and len(found) == 2 and first not in found,
        what="a new process in the killed one's place",
    )
    assert second in pids(iso)
    survivors = pids(iso)
    proc.send_signal(signal.SIGTERM)  # passed on to every process: a warm shutdown
    assert proc.wait(30) == 0
    for pid in survivors:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert pids(iso) == set()  # clean exits take their presence with them
