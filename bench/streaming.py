"""(u) what streaming costs the orchestrator (issue 33): `BENCH_STREAM_JOBS` (1,000) jobs
submitted at once to one orchestrator process, each `BENCH_STREAM_TURNS` (3) model turns
(a read_file call in each but the last) whose replies stream from a local
OpenAI-compatible server (bench/llm_stream.py: 400 to 800 characters in tokens of 5 to 20,
`BENCH_STREAM_GAP_MS` (10) apart, so that the 50 ms coalescing has several to join).

The same jobs run with `model_delta` events (the default) and without them
(`CLAWQ_STREAM_MODEL_DELTAS=false`: the same streams are read, no delta is sent), in
`BENCH_STREAM_ROUNDS` (3) rounds of one run each, alternating which goes first, each on
a fresh orchestrator that first ran a few jobs to warm up. Measured: the orchestrator
process's CPU seconds (user + system, from /proc: the model server, the worker, Redis and
PostgreSQL not counted) from the submit to the last job's end, and the wall time. The
goal: with deltas, at most 1.15x the CPU without. Each run checks what a client of its
jobs sees (folded as `job.stream()` folds): each turn's text is the reply the server
streamed, all of it from deltas (on) or from `model_text` (off); and counts the events
that reached a stream twice (a Redis batch whose reply came later than 5 s is sent again:
at least once; clients skip a delta they hold by its offset). `BENCH_PROFILE=DIR` writes
py-spy's stacks of each run's orchestrator there.
"""

from __future__ import annotations

import os
import socket
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
from bench.llm_stream import reply_text
from broker import keys
from broker.protocol import FINAL_STATUSES, Event, JobSpec
from broker.redis.presence import live_processes
from orchestrator.client.deltas import Folder, JobEnded, TextDelta

JOBS = int(os.environ.get("BENCH_STREAM_JOBS", "1000"))
TURNS = int(os.environ.get("BENCH_STREAM_TURNS", "3"))
GAP_MS = float(os.environ.get("BENCH_STREAM_GAP_MS", "10"))
ROUNDS = int(os.environ.get("BENCH_STREAM_ROUNDS", "3"))
WARM_JOBS = 20
GOAL = 1.15
PY = sys.executable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def unfinished(bench: Any, ids: list[str], running: list[int] | None = None) -> int:
    """Of these jobs, those not ended; the number running is appended to `running`."""
    with psycopg.connect(bench.database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE NOT status = ANY(%s)),"
            " count(*) FILTER (WHERE status = 'running') FROM jobs WHERE id = ANY(%s)",
            (list(FINAL_STATUSES), ids),
        ).fetchone()
    if row and running is not None:
        running.append(int(row[1]))
    return int(row[0]) if row else 0


def not_completed(bench: Any, ids: list[str]) -> int:
    with psycopg.connect(bench.database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND status <> 'completed'", (ids,)
        ).fetchone()
    return int(row[0]) if row else 0


def what_clients_saw(bench: Any, ids: list[str], on: bool) -> tuple[int, int]:
    """The jobs' model_delta events, and their events sent twice (a batch sent again after
    its reply was late: at least once, as documented); raises unless each turn's text,
    folded as a client folds it (`job.stream()`), is the reply the server streamed, wholly
    from deltas (on) or wholly from `model_text` (off)."""
    pipe = bench.redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.xrange(keys.events(job_id))
    deltas = twice = 0
    for job_id, entries in zip(ids, pipe.execute(), strict=True):
        folder, seen = Folder(), set()
        streamed: dict[int, str] = {}
        final: dict[int, str] = {}
        for stream_id, fields in entries:
            twice += fields[b"e"] in seen
            seen.add(fields[b"e"])
            event = Event.model_validate_json(fields[b"e"]).model_copy(update={"id": stream_id})
            deltas += event.type == "model_delta"
            for item in folder.take(event):
                if isinstance(item, JobEnded):
                    continue
                if not isinstance(item, TextDelta):
                    raise RuntimeError(f"job {job_id}: {item!r}")
                into = final if item.final else streamed
                into[item.turn] = into.get(item.turn, "") + item.text
        want = {t + 1: reply_text(t) for t in range(TURNS)}
        if (streamed, final) != ((want, {}) if on else ({}, want)):
            raise RuntimeError(f"job {job_id}: not the replies streamed: {streamed} {final}")
    return deltas, twice


def one_run(
    bench: Any, process: Any, wait_for: Callable[..., None], env: dict[str, str], on: bool
) -> dict[str, float]:
    workspace = tempfile.mkdtemp(prefix="clawq-bench-stream-")
    with open(os.path.join(workspace, "notes.txt"), "w") as fh:
        fh.write("a\nb\n")
    spec = JobSpec(
        prompt="talk",
        model="openai:bench",
        workspace=workspace,
        allow=["read_file"],
        max_iterations=TURNS + 1,
        admin=True,
    )
    env = {**env, "CLAWQ_STREAM_MODEL_DELTAS": "true" if on else "false"}
    cli = [PY, "-m", "orchestrator.cli", "orchestrator", "--log-level", "warning"]
    with process(cli, env) as orch:
        wait_for(
            lambda: any(
                p.get("kind") == "orchestrator" and p.get("pid") == orch.pid
                for p in live_processes(bench.redis)
            )
        )
        warm = hotpath.submit_many(bench, [spec] * WARM_JOBS)
        wait_for(lambda: unfinished(bench, warm) == 0, timeout=120)
        time.sleep(0.5)
        cpu = hotpath.process_cpu(orch.pid)
        started = time.perf_counter()
        running: list[int] = []
        with hotpath.profiled(orch.pid):
            ids = hotpath.submit_many(bench, [spec] * JOBS)
            wait_for(lambda: unfinished(bench, ids, running) == 0, timeout=900)
        wall = time.perf_counter() - started
        cpu = hotpath.process_cpu(orch.pid) - cpu
    deltas, twice = what_clients_saw(bench, ids, on)
    return {
        "cpu_s": cpu,
        "wall_s": wall,
        "failed": not_completed(bench, ids + warm),
        "highest": max(running),
        "deltas": deltas,
        "twice": twice,
    }


def measure(bench: Any, process: Any, wait_for: Callable[..., None]) -> dict[bool, list[Any]]:
    port = free_port()
    server = [PY, "-m", "bench.llm_stream", str(port), str(TURNS), str(GAP_MS)]
    env = {
        **hotpath.stack_env(bench, JOBS + WARM_JOBS),
        "CLAWQ_OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
        "CLAWQ_OPENAI_API_KEY": "bench",
    }
    runs: dict[bool, list[Any]] = {True: [], False: []}
    with process(server, {}), process([PY, "-m", "bench.noop", "1", "direct"], env):
        wait_for(lambda: listening(port))
        wait_for(bench.workers_ready("fs", 1))
        for n in range(ROUNDS):
            for on in (True, False) if n % 2 == 0 else (False, True):
                runs[on].append(one_run(bench, process, wait_for, env, on))
    return runs


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    """The median, and the lowest and highest."""
    low, mid, high = (fmt.format(v) for v in (min(values), statistics.median(values), max(values)))
    return f"{mid} [{low}, {high}]"


def run(console: Console, bench: Any, process: Any, wait_for: Callable[..., None]) -> None:
    hotpath.reset(bench)
    runs = measure(bench, process, wait_for)
    hotpath.reset(bench)
    load = os.getloadavg()
    table = Table(
        title=f"(u) {JOBS} streaming jobs at once on one orchestrator, {TURNS} turns each "
        f"(400-800 characters in 5-20-character tokens {GAP_MS:g} ms apart); {ROUNDS} "
        f"alternating runs each, median \\[lowest, highest]; load {load[0]:.1f} {load[1]:.1f}"
    )
    for col in (
        "deltas",
        "orchestrator CPU s",
        "wall s",
        "deltas/turn",
        "most running",
        "failed",
        "sent twice",
        "CPU vs off",
    ):
        table.add_column(col, justify="right")
    base = statistics.median(r["cpu_s"] for r in runs[False])
    for name, on in (("off", False), ("on", True)):
        cpu = [r["cpu_s"] for r in runs[on]]
        table.add_row(
            name,
            spread(cpu),
            spread([r["wall_s"] for r in runs[on]]),
            f"{statistics.median(r['deltas'] for r in runs[on]) / (JOBS * TURNS):.1f}",
            f"{min(r['highest'] for r in runs[on]):.0f}",
            str(sum(int(r["failed"]) for r in runs[on])),
            str(sum(int(r["twice"]) for r in runs[on])),
            f"{statistics.median(cpu) / base:.3f}x",
        )
    console.print(table)
    paired = [a["cpu_s"] / b["cpu_s"] for a, b in zip(runs[True], runs[False], strict=True)]
    ratio = statistics.median(r["cpu_s"] for r in runs[True]) / base
    each = {on: " ".join(f"{r['cpu_s']:.1f}" for r in runs[on]) for on in runs}
    console.print(
        f"(u) orchestrator CPU with deltas / without: {ratio:.3f}x (goal ≤ {GOAL:.2f}x: "
        f"{'met' if ratio <= GOAL else 'NOT met'}); round by round "
        f"{' '.join(f'{p:.3f}x' for p in paired)}; CPU s of each run with deltas "
        f"{each[True]}, without {each[False]}"
    )
