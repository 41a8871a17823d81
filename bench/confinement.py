"""(l) what confinement costs: `exec true` run as a worker runs it, unconfined and under
bubblewrap, in the same run (p50 over many calls, in process, no queue in between)."""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from rich.console import Console
from rich.table import Table

from broker.config.settings import Settings
from broker.protocol import CallContext
from workers.confine import host as confine
from workers.execute import run_tool
from workers.registry import default_registry
from workers.tool import ToolContext

CALLS = int(os.environ.get("BENCH_CONFINE_CALLS", "300"))


def exec_true(settings: Settings, workspace: str, calls: int) -> list[float]:
    registry = default_registry()
    ctx = ToolContext(context=CallContext(workspace=workspace), settings=settings)
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        result = run_tool(registry, "exec", {"command": "true"}, ctx)
        times.append(time.perf_counter() - started)
        if result.is_error:
            raise RuntimeError(f"exec true failed: {result.for_llm}")
    return times


def run(console: Console) -> None:
    bwrap = Settings(exec_confinement="bwrap")
    if not confine.for_settings(bwrap).confined:
        console.print("(l) skipped: bubblewrap does not work on this machine")
        return
    with tempfile.TemporaryDirectory(prefix="clawq-bench-") as ws:
        exec_true(bwrap, ws, 10)  # warm both paths up
        plain = exec_true(Settings(exec_confinement="none"), ws, CALLS)
        confined = exec_true(bwrap, ws, CALLS)
    table = Table(title=f"(l) `exec true` in process, {CALLS} calls each")
    for col in ("confinement", "p50 ms", "p99 ms", "vs unconfined (p50)"):
        table.add_column(col, justify="right")
    base = statistics.median(plain)
    for name, times in (("none", plain), ("bwrap", confined)):
        ordered = sorted(times)
        table.add_row(
            name,
            f"{statistics.median(times) * 1e3:.2f}",
            f"{ordered[int(0.99 * (len(ordered) - 1))] * 1e3:.2f}",
            f"{statistics.median(times) / base:.2f}x",
        )
    console.print(table)


if __name__ == "__main__":
    run(Console())
