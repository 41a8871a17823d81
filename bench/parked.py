"""(s) jobs waiting for a person (issue 31): `BENCH_PARKED_JOBS` (10,000) jobs whose first
call asks for approval, on one orchestrator process allowed to run them all, in two runs
in the same bench: held in memory while they wait (clawq before issue 31: `park_after_s`
never reached) and parked (`park_after_s` 0.5). They come in waves of `BENCH_PARKED_WAVE`
(200), each once the last is waiting, as people's approvals pile up over hours. For each
run, the orchestrator's RSS with every job waiting (and with a tenth of them) against its
RSS at rest (after three waves of such jobs waited, were answered and ended: a process that
has worked under that load), and its peak; then
`BENCH_PARKED_ANSWERS` of the jobs answered one at a time: the time from the answer to
the job's next model turn (`turn_started`), which a parked job reaches through the
agents queue and its transcript.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table

from bench import hotpath
from broker import keys
from broker.protocol import JobSpec

JOBS = int(os.environ.get("BENCH_PARKED_JOBS", "10000"))
WAVE = int(os.environ.get("BENCH_PARKED_WAVE", "200"))  # jobs arriving together
WARM_WAVES = 3
ANSWERS = int(os.environ.get("BENCH_PARKED_ANSWERS", "20"))
PY = sys.executable
SKIP = os.environ.get("BENCH_PARKED_SKIP", "")  # "held" or "parked": the other run alone


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(field)) / 1024


def waiting(bench: Any, parked: bool) -> int:
    """Jobs waiting for their answer: parked ones by status, held ones by their request."""
    with psycopg.connect(bench.database_url) as conn:
        if parked:
            row = conn.execute("SELECT count(*) FROM jobs WHERE status = 'waiting'").fetchone()
        else:
            row = conn.execute("SELECT count(*) FROM approvals WHERE status = 'pending'").fetchone()
    return int(row[0]) if row else 0


def next_turn_s(bench: Any, job_id: str, answered_at: float, wait_for: Any) -> float:
    """From the answer to the job's second `turn_started`."""

    def second() -> float | None:
        starts = [
            json.loads(fields[b"e"])["at"]
            for _, fields in bench.redis.xrange(keys.events(job_id))
            if json.loads(fields[b"e"])["type"] == "turn_started"
        ]
        return starts[1] if len(starts) > 1 else None

    found: list[float] = []
    wait_for(lambda: bool(found.append(s) or True) if (s := second()) else False, timeout=60)
    return found[0] - answered_at


def one_run(bench: Any, process: Any, wait_for: Callable[..., None], park: bool) -> dict[str, Any]:
    from orchestrator.client import Client

    hotpath.reset(bench)
    workspace = tempfile.mkdtemp(prefix="clawq-bench-parked-")
    env = {
        **hotpath.stack_env(bench, JOBS + 10),
        "CLAWQ_PARK_AFTER_S": "0.5" if park else "1000000000",
        "CLAWQ_APPROVAL_TIMEOUT_S": "0",
    }
    cli = [PY, "-m", "orchestrator.cli"]
    turn = {
        "tool_calls": [{"id": "w", "name": "write_file", "input": {"path": "x", "content": "y"}}]
    }
    script = {"turns": [turn, {"text": "done"}]}
    spec = JobSpec(
        prompt="wait", script=script, workspace=workspace, ask=["write_file"], admin=True
    )
    with (
        process([*cli, "orchestrator", "--log-level", "warning"], env) as orch,
        process([PY, "-m", "bench.noop", "1", "direct"], env),
    ):
        wait_for(bench.workers_ready("fs", 1))
        wait_for(lambda: hotpath.orchestrators(bench) >= 1)
        # at rest: a process that has had such jobs come as they will (WARM_WAVES waves
        # one after the other), wait, be answered and end
        warm: list[str] = []
        for _ in range(WARM_WAVES):
            warm += hotpath.submit_many(bench, [spec] * WAVE)
            warm_end = len(warm)
            wait_for(lambda: waiting(bench, park) >= warm_end, timeout=600)  # noqa: B023
        with Client(bench.settings) as client, psycopg.connect(bench.database_url) as conn:
            asked = conn.execute("SELECT id, job_id FROM approvals").fetchall()
            for request_id, job_id in asked:
                client.job(job_id).approve(request_id, "allow-once", by="bench")
        wait_for(lambda: all(hotpath.status(bench, j) == "completed" for j in warm), timeout=600)
        time.sleep(3.0)
        idle = rss_mb(orch.pid)
        started = time.perf_counter()
        ids: list[str] = []
        tenth = 0.0
        while len(ids) < JOBS:
            ids += hotpath.submit_many(bench, [spec] * min(WAVE, JOBS - len(ids)))
            wave_end = len(ids)
            wait_for(lambda: waiting(bench, park) >= wave_end, timeout=600)  # noqa: B023
            if not tenth and len(ids) >= JOBS // 10:
                time.sleep(3.0)
                tenth = rss_mb(orch.pid)
        took = time.perf_counter() - started
        time.sleep(3.0)  # what settles after the last one
        held = rss_mb(orch.pid)
        peak = rss_mb(orch.pid, "VmHWM")
        latencies = []
        with Client(bench.settings) as client:
            with psycopg.connect(bench.database_url) as conn:
                rows = conn.execute(
                    "SELECT id, job_id FROM approvals WHERE job_id = ANY(%s)"
                    " AND status = 'pending' LIMIT %s",
                    (ids, ANSWERS),
                ).fetchall()
            for request_id, job_id in rows:
                answered_at = time.time()
                client.job(job_id).approve(request_id, "allow-once", by="bench")
                latencies.append(next_turn_s(bench, job_id, answered_at, wait_for))
    return {
        "idle_mb": idle,
        "waiting_mb": held,
        "tenth_mb": tenth,
        "peak_mb": peak,
        "to_wait_s": took,
        "p50_ms": statistics.median(latencies) * 1e3,
        "max_ms": max(latencies) * 1e3,
    }


def run(console: Console, bench: Any, process: Any, wait_for: Callable[..., None]) -> None:
    held = one_run(bench, process, wait_for, park=False) if "held" not in SKIP else {}
    parked = one_run(bench, process, wait_for, park=True) if "parked" not in SKIP else {}
    hotpath.reset(bench)
    table = Table(
        title=f"(s) {JOBS} jobs waiting for an approval on one orchestrator (in waves of "
        f"{WAVE}); {ANSWERS} answered one at a time"
    )
    for col in (
        "jobs",
        "RSS at rest MB",
        f"RSS {JOBS // 10} waiting MB",
        "RSS all waiting MB",
        "vs at rest",
        "peak MB",
        "all waiting after s",
        "answer → next turn p50 ms",
        "max ms",
    ):
        table.add_column(col, justify="right")
    runs = [("held in memory (before issue 31)", held), ("parked", parked)]
    for name, r in [(n, r) for n, r in runs if r]:
        table.add_row(
            name,
            f"{r['idle_mb']:.0f}",
            f"{r['tenth_mb']:.0f}",
            f"{r['waiting_mb']:.0f}",
            f"{r['waiting_mb'] / r['idle_mb']:.2f}x",
            f"{r['peak_mb']:.0f}",
            f"{r['to_wait_s']:.1f}",
            f"{r['p50_ms']:.0f}",
            f"{r['max_ms']:.0f}",
        )
    console.print(table)
