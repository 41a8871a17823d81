"""(q) messages through the outbox: `message` sends to a signed webhook on a local server,
(1) in-process, one after another (outbox claim + HMAC + egress client + outbox record),
against bare httpx posting the same body sequentially; (2) through the messaging queue and
one worker of 4 processes, 400 concurrent calls, against bare httpx from 4
threads. Every message must arrive once."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import redis
from rich.console import Console
from rich.table import Table

from broker.config.settings import Settings
from broker.pg.store import Store
from broker.protocol import CallContext, CallEnvelope
from orchestrator.calls.dispatch import running_dispatcher

SEQUENTIAL = int(os.environ.get("BENCH_MESSAGES", "500"))
CONCURRENT = int(os.environ.get("BENCH_MESSAGES_CONCURRENT", "400"))
PROCESSES = 4
SECRET_ENV = "BENCH_HOOK_SECRET"


class Receiver(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    count = 0
    lock = threading.Lock()

    def setup(self) -> None:
        super().setup()
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle stalls

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with Receiver.lock:
            Receiver.count += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512


def bare(url: str, n: int, threads: int) -> float:
    body = json.dumps({"event": "message", "text": "build finished"}).encode()
    with httpx.Client(limits=httpx.Limits(max_connections=threads)) as client:

        def one(_: int) -> None:
            r = client.post(url, content=body, headers={"Content-Type": "application/json"})
            r.raise_for_status()

        one(-1)
        started = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(n)))
        return time.perf_counter() - started


def in_process(settings: Settings, n: int) -> float:
    from workers.execute import run_tool
    from workers.registry import default_registry
    from workers.tool import ToolContext

    registry = default_registry()
    store = Store(settings.database_url)
    client = redis.Redis.from_url(settings.redis_url)
    job = uuid.uuid4().hex
    try:

        def one(i: int) -> None:
            ctx = ToolContext(
                CallContext(workspace="/tmp"),
                settings,
                job_id=job,
                call_id=f"m{i}",
                store=lambda: store,
                redis=client,
            )
            result = run_tool(registry, "message", {"channel": "hook", "text": "built"}, ctx)
            if result.is_error:
                raise RuntimeError(result.for_llm)

        one(-1)
        started = time.perf_counter()
        for i in range(n):
            one(i)
        return time.perf_counter() - started
    finally:
        client.close()
        store.close()


async def through_queue(settings: Settings, n: int) -> float:
    async with running_dispatcher(settings, f"bench-msg-{uuid.uuid4().hex[:6]}") as d:
        job = uuid.uuid4().hex

        async def one(i: int) -> None:
            envelope = CallEnvelope(
                call_id=f"q{i}",
                job_id=job,
                session_id=job,
                tool="message",
                input={"channel": "hook", "text": "built"},
                context=CallContext(workspace="/tmp"),
                timeout_s=60,
                deadline=time.time() + 600,
                reply_to=d.reply_key,
            )
            outcome = await d.call(envelope, "messaging")
            if outcome.is_error:
                raise RuntimeError(outcome.for_llm[:200])

        await one(-1)
        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return time.perf_counter() - started


def run(console: Console, bench: Any, process: Any, wait_for: Any) -> None:
    server = Server(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    os.environ[SECRET_ENV] = "bench-secret"
    channels = {"hook": {"kind": "webhook", "url": url, "secret_env": SECRET_ENV}}
    allow = [f"127.0.0.1:{server.server_address[1]}"]
    settings = Settings.model_validate(
        {
            **bench.settings.model_dump(),
            "message_channels": channels,
            "message_rate_per_minute": 1_000_000,
            "web_private_allow": allow,
        }
    )
    env = {
        **bench.env,
        "CLAWQ_MESSAGE_CHANNELS": json.dumps(channels),
        "CLAWQ_MESSAGE_RATE_PER_MINUTE": "1000000",
        "CLAWQ_WEB_PRIVATE_ALLOW": json.dumps(allow),
        SECRET_ENV: "bench-secret",
    }
    worker = [sys.executable, "-m", "orchestrator.cli", "worker", "--group", "messaging"]
    worker += ["--concurrency", str(PROCESSES), "--log-level", "warning"]
    try:
        bare_seq = bare(url, SEQUENTIAL, 1)
        ours_seq = in_process(settings, SEQUENTIAL)
        bare_par = bare(url, CONCURRENT, PROCESSES)
        with process(worker, env):
            wait_for(bench.workers_ready("messaging", PROCESSES))
            ours_par = asyncio.run(through_queue(settings, CONCURRENT))
    finally:
        server.shutdown()
        server.server_close()
    expected = 2 + SEQUENTIAL * 2 + CONCURRENT * 2 + 2
    if Receiver.count != expected:
        raise RuntimeError(f"the receiver got {Receiver.count} posts, not {expected}")
    table = Table(title="(q) message to a signed webhook on a local server")
    for col in ("path", "messages", "msg/s", "vs bare httpx"):
        table.add_column(col, justify="right")
    rows = (
        ("bare httpx post, sequential", SEQUENTIAL, bare_seq, bare_seq),
        ("message in-process (outbox, HMAC, egress)", SEQUENTIAL, ours_seq, bare_seq),
        (f"bare httpx post, {PROCESSES} threads", CONCURRENT, bare_par, bare_par),
        (f"message via queue, 1 worker x {PROCESSES}", CONCURRENT, ours_par, bare_par),
    )
    for name, n, wall, base in rows:
        table.add_row(name, str(n), f"{n / wall:.0f}", f"{base / wall:.2f}x")
    console.print(table)
