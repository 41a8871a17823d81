"""(m) web_fetch at scale: 200 concurrent calls of a local endpoint that answers after 200 ms,
through ONE web worker process (threads pool), against bare httpx asyncio fetching the same
200 URLs, turn about in ROUNDS rounds of one run (bench/rounds.py); every call must succeed."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from rich.console import Console

from bench.rounds import ROUNDS, Rounds
from broker.protocol import CallContext, CallEnvelope
from orchestrator.calls.dispatch import running_dispatcher

CALLS = int(os.environ.get("BENCH_WEB_CALLS", "200"))
DELAY_S = 0.2
THREADS = int(os.environ.get("BENCH_WEB_THREADS", "100"))  # the default of a web worker
PAGE = b"<html><head><title>t</title></head><body><p>" + b"slow words " * 60 + b"</p></body></html>"


class Slow(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        time.sleep(DELAY_S)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args: Any) -> None:
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512


async def bare(urls: list[str]) -> float:
    async with httpx.AsyncClient(
        limits=httpx.Limits(max_connections=len(urls)), timeout=30
    ) as client:
        started = time.perf_counter()
        responses = await asyncio.gather(*(client.get(u) for u in urls))
        wall = time.perf_counter() - started
    if any(r.status_code != 200 for r in responses):
        raise RuntimeError("bare httpx: a request failed")
    return wall


async def through_clawq(bench: Any, urls: list[str]) -> float:
    async with running_dispatcher(bench.settings, f"bench-web-{uuid.uuid4().hex[:6]}") as d:
        job = uuid.uuid4().hex

        async def one(i: int, url: str) -> None:
            envelope = CallEnvelope(
                call_id=f"w{i}",
                job_id=job,
                session_id=job,
                tool="web_fetch",
                input={"url": url},
                context=CallContext(workspace="/tmp"),
                timeout_s=60,
                deadline=time.time() + 600,
                reply_to=d.reply_key,
            )
            outcome = await d.call(envelope, "web")
            if outcome.is_error or "slow words" not in outcome.for_llm:
                raise RuntimeError(f"web_fetch {url} failed: {outcome.for_llm[:200]}")

        await one(-1, urls[0] + "&warm=1")
        started = time.perf_counter()
        await asyncio.gather(*(one(i, u) for i, u in enumerate(urls)))
        return time.perf_counter() - started


def serve() -> None:
    """The endpoint, in a process of its own (`python -m bench.web`): in the bench's
    process its threads would share a GIL with the bare client and slow the baseline."""
    server = Server(("127.0.0.1", 0), Slow)
    print(server.server_address[1], flush=True)
    server.serve_forever(0.05)


def run(console: Console, bench: Any, process: Any, wait_for: Any) -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.web"], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    port = int(server.stdout.readline())
    env = {
        **bench.env,
        "CLAWQ_WEB_PRIVATE_ALLOW": f'["127.0.0.1:{port}"]',
        "CLAWQ_WEB_WORKER_CONCURRENCY": str(THREADS),
    }
    worker = [
        sys.executable,
        "-m",
        "orchestrator.cli",
        "worker",
        "--group",
        "web",
        "--log-level",
        "warning",
    ]
    rounds = Rounds("s")
    try:
        base_urls = [f"http://127.0.0.1:{port}/p?n={i}" for i in range(CALLS)]
        with process(worker, env):
            wait_for(bench.workers_ready("web", 1))
            for _ in range(ROUNDS):
                fresh = uuid.uuid4().hex[:6]  # fresh URLs: nothing comes from the cache
                rounds.add(BARE, asyncio.run(bare([f"{u}&r={fresh}" for u in base_urls])))
                fresh = uuid.uuid4().hex[:6]
                ours = asyncio.run(through_clawq(bench, [f"{u}&r={fresh}" for u in base_urls]))
                rounds.add(OURS, ours)
    finally:
        server.terminate()
        server.wait(15)
    title = (
        f"(m) {CALLS} concurrent web_fetch of a {DELAY_S * 1000:.0f} ms endpoint, one web "
        f"worker process ({THREADS} threads), wall; goal: ≤ 1.5x bare httpx"
    )
    console.print(rounds.table(title, BARE))


BARE = "bare httpx.AsyncClient, same server"
OURS = "clawq web_fetch (queue, worker, egress guard, extraction)"


if __name__ == "__main__":
    serve()
