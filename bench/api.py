"""(n) the HTTP API: submit → the job's first events, over the API against the direct
client, on the same stack in the same run; then 500 concurrent event streams held by one
API process, its RSS, and how long the last stream takes to see the job end once it does."""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

import httpx
from httpx_sse import connect_sse
from rich.console import Console
from rich.table import Table

from broker.stores.api_keys import ApiKeyStore
from orchestrator.client import Client

JOBS = int(os.environ.get("BENCH_API_JOBS", "50"))
STREAMS = int(os.environ.get("BENCH_API_STREAMS", "500"))
PY = sys.executable
SCRIPT = {"turns": [{"text": "done"}]}


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def direct_latency(client: Client, workspace: str) -> list[float]:
    times = []
    for _ in range(JOBS):
        started = time.perf_counter()
        job = client.submit("x", workspace=workspace, script=SCRIPT)
        for event in job.events():
            if event.type == "job_started":
                times.append(time.perf_counter() - started)
                break
        job.wait(timeout=30)
    return times


def api_latency(url: str, key: str, workspace: str) -> list[float]:
    times = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as http:
        for _ in range(JOBS):
            started = time.perf_counter()
            job_id = http.post(
                "/v1/jobs", json={"prompt": "x", "workspace": workspace, "script": SCRIPT}
            ).json()["job_id"]
            with connect_sse(http, "GET", f"/v1/jobs/{job_id}/events") as source:
                for sse in source.iter_sse():
                    if sse.event == "job_started":
                        times.append(time.perf_counter() - started)
                        break
    return times


async def hold_streams(
    port: int, key: str, job_id: str, count: int, ended: asyncio.Event
) -> list[float]:
    """`count` raw SSE connections; each returns when it has read `job_finished`."""
    request = (
        f"GET /v1/jobs/{job_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {key}\r\nAccept: text/event-stream\r\n\r\n"
    ).encode()
    opened = 0

    async def one() -> float:
        nonlocal opened
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"an event stream was refused: {head.splitlines()[0]!r}")
        opened += 1
        while True:
            line = await reader.readline()
            if not line or line.startswith(b"event: job_finished"):
                break
        writer.close()
        return time.perf_counter()

    tasks = [asyncio.create_task(one()) for _ in range(count)]
    deadline = time.monotonic() + 120
    while opened < count:
        failed = next((t for t in tasks if t.done() and t.exception()), None)
        if failed is not None:
            raise failed.exception()  # type: ignore[misc]
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {opened} of {count} event streams opened in 120 s")
        await asyncio.sleep(0.05)
    ended.set()
    return await asyncio.gather(*tasks)


def run(console: Console, bench: Any, process: Any, wait_for: Any) -> None:
    workspace = tempfile.mkdtemp(prefix="clawq-bench-")
    port = free_port()
    cli = [PY, "-m", "orchestrator.cli"]
    env = {
        **bench.env,
        "CLAWQ_API_RATE_LIMIT_PER_MINUTE": "0",
        "CLAWQ_API_MAX_RUNNING_JOBS": "100000",
    }
    with (
        process([*cli, "orchestrator", "--log-level", "warning"], env),
        process([*cli, "worker", "--group", "fs", "--log-level", "warning"], env),
        process([*cli, "api", "--port", str(port), "--log-level", "warning"], env) as api_proc,
        Client(bench.settings) as client,
    ):
        wait_for(bench.workers_ready("fs", 1))
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _up(url))
        key = ApiKeyStore(client.store).create("bench")[1]
        direct = direct_latency(client, workspace)
        over_api = api_latency(url, key, workspace)
        held = client.submit(
            "wait",
            workspace=workspace,
            ask=["write_file"],
            user="bench",
            script={
                "turns": [
                    {
                        "tool_calls": [
                            {
                                "id": "w",
                                "name": "write_file",
                                "input": {"path": "a", "content": "x"},
                            }
                        ]
                    },
                    {"text": "done"},
                ]
            },
        )
        request = next(e for e in held.events() if e.type == "approval_requested")
        base_rss = rss_mb(api_proc.pid)

        async def storm() -> tuple[float, float, float]:
            ended = asyncio.Event()
            task = asyncio.create_task(hold_streams(port, key, held.id, STREAMS, ended))
            waiting = asyncio.create_task(ended.wait())
            await asyncio.wait([task, waiting], return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                task.result()  # the streams failed: say why
            rss = rss_mb(api_proc.pid)
            answered = time.perf_counter()
            await asyncio.to_thread(held.approve, request.data["request_id"], "allow-once")
            finished = await task
            return rss, max(finished) - answered, statistics.median(finished) - answered

        rss, last_s, median_s = asyncio.run(storm())

    table = Table(title=f"(n) the HTTP API: submit → job_started, {JOBS} jobs one after another")
    for col in ("path", "p50 ms", "p99 ms", "vs direct"):
        table.add_column(col, justify="right")
    for name, times in (("direct client", direct), ("over the API (POST + SSE)", over_api)):
        ordered = sorted(times)
        table.add_row(
            name,
            f"{statistics.median(times) * 1e3:.1f}",
            f"{ordered[int(0.99 * (len(ordered) - 1))] * 1e3:.1f}",
            f"{statistics.median(times) / statistics.median(direct):.2f}x",
        )
    console.print(table)
    table = Table(title=f"(n) {STREAMS} concurrent event streams on one API process")
    for col in (
        "API RSS before MB",
        "with the streams MB",
        "job end → median stream s",
        "→ last stream s",
    ):
        table.add_column(col, justify="right")
    table.add_row(f"{base_rss:.0f}", f"{rss:.0f}", f"{median_s:.3f}", f"{last_s:.3f}")
    console.print(table)


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
