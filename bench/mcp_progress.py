"""(r) What progress costs: an MCP call whose server reports progress at each of its steps
(`steps` of tests/mcp_servers/web_server.py over stdio, no sleep between steps) against the
same call told not to report. In this process on a held session, each notification
becoming a `tool_call_progress` event in Redis as the mcp tool makes it; and through clawq
(orchestrator → mcp worker → held session), queued-to-finished per call. Medians; the
ratio is the cost of the progress path, per call and per notification."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

import redis
from rich.console import Console
from rich.table import Table

STEPS = int(os.environ.get("BENCH_MCP_STEPS", "50"))
CALLS = int(os.environ.get("BENCH_MCP_PROGRESS_CALLS", "30"))
SERVER = {"command": sys.executable, "args": ["-m", "tests.mcp_servers.web_server", "stdio"]}


def in_process(settings: Any) -> tuple[float, float, float]:
    """Median seconds of a quiet call, of a reporting one, and of a reporting one whose
    notifications are heard but made nothing of (the server's and the protocol's share),
    alternating."""
    from broker.config.mcp import parse_servers
    from broker.protocol import CallContext
    from workers.tool import ToolContext
    from workers.tools.mcp.client import McpManager
    from workers.tools.mcp.tool import progress_events

    client = redis.Redis.from_url(settings.redis_url)
    ctx = ToolContext(
        context=CallContext(workspace="/tmp"),
        settings=settings,
        job_id=f"bench-{uuid.uuid4().hex[:8]}",
        call_id="c",
        redis=client,
    )
    report = progress_events(ctx, "mcp_bench__steps")
    manager = McpManager(settings, lambda: parse_servers({"bench": SERVER}), lambda *_: None)
    timings: dict[str, list[float]] = {"quiet": [], "loud": [], "wire": []}
    try:
        manager.call("bench", "steps", {"count": 1, "interval": 0})  # the session is up
        for _ in range(CALLS):
            for kind in timings:
                args = {"count": STEPS, "interval": 0, "report": kind != "quiet"}
                started = time.perf_counter()
                manager.call("bench", "steps", args, progress=None if kind == "wire" else report)
                timings[kind].append(time.perf_counter() - started)
        heard = client.xlen(f"clawq:events:{ctx.job_id}")
        if heard != CALLS * STEPS:
            raise RuntimeError(f"{heard} progress events, not {CALLS * STEPS}")
    finally:
        manager.close()
        client.close()
    return tuple(statistics.median(timings[k]) for k in ("quiet", "loud", "wire"))  # type: ignore[return-value]


def through_clawq(bench: Any, process: Any, wait_for: Any) -> tuple[float, float]:
    from orchestrator.client import Client

    client = Client(bench.settings)
    client.mcp.add({"mcpServers": {"bench": SERVER}})
    client.mcp.grant("bench", agent="main")
    cli = [sys.executable, "-m", "orchestrator.cli"]

    def script(loud: bool) -> dict[str, Any]:
        args = {"count": STEPS, "interval": 0, "report": loud}
        turn = {"tool_calls": [{"id": "s", "name": "mcp_bench__steps", "input": args}]}
        return {"turns": [turn] * CALLS + [{"text": "done"}]}

    worker = [*cli, "worker", "--group", "mcp", "--concurrency", "1", "--log-level", "warning"]
    medians = []
    try:
        with (
            process([*cli, "orchestrator", "--log-level", "warning"], bench.env),
            process(worker, bench.env),
        ):
            wait_for(lambda: "mcp_bench__steps" in {t.exposed_name for t in client.mcp.tools()})
            for loud in (False, True):
                job = client.submit(
                    "steps",
                    workspace=tempfile.mkdtemp(prefix="clawq-bench-"),
                    script=script(loud),
                    max_iterations=CALLS + 1,
                )
                if job.wait(timeout=600).status != "completed":
                    raise RuntimeError("the progress bench's job did not complete")
                medians.append(statistics.median(bench.call_latencies([job.id])))
    finally:
        client.close()
    return medians[0], medians[1]


def run(console: Console, bench: Any, process: Any, wait_for: Any) -> None:
    quiet, loud, wire = in_process(bench.settings)
    whole = through_clawq(bench, process, wait_for)
    table = Table(
        title=f"(r) an MCP call of {STEPS} steps with a progress notification at each, "
        f"against the same call without (median of {CALLS})"
    )
    for col in ("path", "no progress ms", "progress ms", "ratio", "µs per notification"):
        table.add_column(col, justify="right")
    for name, (without, with_) in (
        ("held session, notifications only (server and protocol)", (quiet, wire)),
        ("held session, each an event in Redis, in process", (quiet, loud)),
        ("through clawq (orchestrator, mcp worker)", whole),
    ):
        table.add_row(
            name,
            f"{without * 1e3:.2f}",
            f"{with_ * 1e3:.2f}",
            f"{with_ / without:.2f}x",
            f"{(with_ - without) / STEPS * 1e6:.0f}",
        )
    console.print(table)
