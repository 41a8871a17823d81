"""(t) A replay against its original: a scripted job of 100 calls (25 turns of 4: a write,
an edit, a command, a read) run on an orchestrator with fs and runtime workers, then
replayed with the same script: every call answered from the ledger, none run. Wall time
from submit to the job's end; the replay's median of REPLAYS."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

TURNS = int(os.environ.get("BENCH_REPLAY_TURNS", "25"))  # 4 calls a turn
REPLAYS = int(os.environ.get("BENCH_REPLAYS", "3"))


def script() -> dict[str, Any]:
    turns: list[dict[str, Any]] = []
    for i in range(TURNS):
        turns.append(
            {
                "tool_calls": [
                    {"id": f"w{i}", "name": "write_file",
                     "input": {"path": f"f{i}.txt", "content": f"version {i}\n"}},
                    {"id": f"e{i}", "name": "edit_file",
                     "input": {"path": f"f{i}.txt", "old_string": "version", "new_string": "v"}},
                    {"id": f"x{i}", "name": "exec", "input": {"command": f"echo {i} >> log.txt"}},
                    {"id": f"r{i}", "name": "read_file", "input": {"path": f"f{i}.txt"}},
                ]
            }
        )  # fmt: skip
    return {"turns": [*turns, {"text": "done"}]}


def timed(submit: Callable[[], Any]) -> tuple[Any, float]:
    """The job `submit` makes, and the seconds from its submission to its end."""
    started = time.perf_counter()
    job = submit()
    result = job.wait(timeout=600)
    if result.status != "completed":
        raise RuntimeError(f"the replay bench's job ended {result.status}: {result.error}")
    return job, time.perf_counter() - started


def run(console: Console, bench: Any, process: Any, wait_for: Any) -> None:
    from orchestrator.client import Client

    cli = [sys.executable, "-m", "orchestrator.cli"]
    client = Client(bench.settings)
    workspace = tempfile.mkdtemp(prefix="clawq-bench-replay-")
    fs = [*cli, "worker", "--group", "fs", "--concurrency", "2", "--log-level", "warning"]
    runtime = [*cli, "worker", "--group", "runtime", "--concurrency", "2", "--log-level", "warning"]
    try:
        with (
            process([*cli, "orchestrator", "--log-level", "warning"], bench.env),
            process(fs, bench.env),
            process(runtime, bench.env),
        ):
            wait_for(bench.workers_ready("fs", 1))
            wait_for(bench.workers_ready("runtime", 1))
            job, original = timed(
                lambda: client.submit(
                    "a hundred calls",
                    workspace=workspace,
                    allow=["exec"],
                    script=script(),
                    max_iterations=TURNS + 1,
                )
            )
            log = Path(workspace, "log.txt")
            lines = log.read_text().count("\n")
            replays = []
            for _ in range(REPLAYS):
                replay, seconds = timed(lambda: client.replay(job.id))
                replays.append(seconds)
                diff = client.replay_diff(replay.id)
                if not diff.identical or diff.tools_run:
                    raise RuntimeError(f"the replay was not identical: {diff.divergence}")
            after = log.read_text().count("\n")
    finally:
        client.close()
    if after != lines:
        raise RuntimeError(f"a replay ran commands: {after - lines} more lines")
    replay_s = statistics.median(replays)
    table = Table(title=f"(t) a job of {TURNS * 4} calls ({TURNS} turns of 4) and its replay")
    for col in ("run", "wall s", "tools run", "vs original"):
        table.add_column(col, justify="right")
    table.add_row("original", f"{original:.2f}", str(TURNS * 4), "1.00x")
    table.add_row(
        f"replay (median of {REPLAYS})", f"{replay_s:.2f}", "0", f"{replay_s / original:.2f}x"
    )
    console.print(table)
