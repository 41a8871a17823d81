"""`make bench`: three comparisons in one run, printed as tables with ratios.

(a) round trip of a no-op tool call: clawq's whole call path (publish → Celery worker →
    ledger → pushed outcome) vs bare Celery `apply_async().get()` vs a raw Redis echo;
(b) calls per second through one worker process, clawq vs bare Celery;
(c) 1,000 concurrent scripted jobs (3 turns with one call each, then a final answer) on
    one orchestrator process: wall time, p99 call latency, orchestrator peak RSS.
... and (d) to (h) below; (i) to (k), a turn through the whole system and many jobs on one
and two orchestrators, are `bench/hotpath.py`; (l), the cost of confinement, is
`bench/confinement.py`; (m) to (q) are bench/web.py, api.py, memory.py, ui.py and
messaging.py; (r), MCP progress, is bench/mcp_progress.py; (s), jobs waiting for a
person, held in memory or parked, is bench/parked.py; (t), a replay against its original,
is bench/replay.py; (u), what streaming model deltas cost the orchestrator, is
bench/streaming.py; (v), scrubbing a tool result, is bench/scrub.py. `python -m bench
NAME …` runs sections alone: calls ((a), (b)), hotpath ((i) to (k)), turn ((i)), jobs ((j),
(k)), confinement, web, api, memory, ui, messaging, mcp-progress, parked, replay,
streaming, scrub.

Runs against CLAWQ_REDIS_URL / CLAWQ_DATABASE_URL (default: the local services) in a Redis
db and a PostgreSQL schema of its own, removed afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager

import psycopg
import redis
from rich.console import Console
from rich.table import Table

from bench import (
    api,
    confinement,
    hotpath,
    mcp_progress,
    memory,
    messaging,
    parked,
    replay,
    scrub,
    streaming,
    ui,
    web,
)
from bench.rounds import ROUNDS, Rounds
from broker import keys
from broker.config.settings import Settings
from broker.pg.store import Store
from broker.protocol import CallContext, CallEnvelope
from broker.redis.presence import live_processes
from orchestrator.calls.dispatch import Dispatcher, running_dispatcher

console = Console()
ROUND_TRIPS = int(os.environ.get("BENCH_ROUND_TRIPS", "1000"))
THROUGHPUT_CALLS = int(os.environ.get("BENCH_CALLS", "3000"))
JOBS = int(os.environ.get("BENCH_JOBS", "1000"))
SCALE_CALLS = int(os.environ.get("BENCH_SCALE_CALLS", "100"))  # per worker process
PY = sys.executable
CLAWQ_CALL = "clawq call path"
BARE = {"solo": "bare Celery, solo pool", "prefork": "bare Celery, prefork -c 1"}
ECHO = "raw Redis LPUSH/BRPOP echo"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextmanager
def process(args: list[str], env: dict[str, str]):  # type: ignore[no-untyped-def]
    proc = subprocess.Popen(args, env={**os.environ, **env}, stdout=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def wait_for(check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise TimeoutError("bench setup timed out")


BENCH_DB = int(os.environ.get("BENCH_REDIS_DB", "15"))  # the tests use dbs 1 to 14
OWNER_KEY = "clawq:bench:owner"


class Bench:
    def __init__(self) -> None:
        base = Settings()
        base_redis = base.redis_url.rsplit("/", 1)[0]
        self.redis_url = f"{base_redis}/{BENCH_DB}"
        self.schema = "bench_" + uuid.uuid4().hex[:8]
        sep = "&" if "?" in base.database_url else "?"
        self.db_base = base.database_url
        self.database_url = f"{base.database_url}{sep}options=-csearch_path%3D{self.schema}"
        self.redis = redis.Redis.from_url(self.redis_url)
        if self.redis.dbsize() and not self.redis.exists(OWNER_KEY):  # never wipe others' data
            raise SystemExit(
                f"Redis db {BENCH_DB} holds keys that are not the bench's: empty it or set "
                "BENCH_REDIS_DB to a free db"
            )
        self.redis.flushdb()  # empty, or what an interrupted bench run left
        self.redis.set(OWNER_KEY, "1")
        with psycopg.connect(self.db_base, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {self.schema}")
        store = Store(self.database_url)
        store.migrate()
        store.close()
        self.settings = Settings(redis_url=self.redis_url, database_url=self.database_url)
        self.env = {
            "CLAWQ_REDIS_URL": self.redis_url,
            "CLAWQ_DATABASE_URL": self.database_url,
            "BENCH_REDIS_URL": self.redis_url,
            "CLAWQ_LOOP_REPEAT_WARN": "0",  # the benches repeat one call on purpose
        }

    def close(self) -> None:
        self.redis.flushdb()
        self.redis.close()
        with psycopg.connect(self.db_base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {self.schema} CASCADE")

    def workers_ready(self, queue: str, count: int) -> Callable[[], bool]:
        def check() -> bool:
            live = live_processes(self.redis)
            return sum(1 for p in live if p.get("queue") == queue) >= count

        return check

    # -- (a) and (b): clawq's call path --------------------------------------------------

    async def clawq_calls(self, n_sequential: int, n_concurrent: int) -> tuple[list[float], float]:
        async with running_dispatcher(self.settings, "bench-orchestrator") as dispatcher:
            return await self._calls(dispatcher, n_sequential, n_concurrent)

    async def _calls(
        self, dispatcher: Dispatcher, n_sequential: int, n_concurrent: int
    ) -> tuple[list[float], float]:

        def envelope(i: int) -> CallEnvelope:
            return CallEnvelope(
                call_id=f"c{i}",
                job_id="bench",
                turn=0,
                session_id="bench",
                tool="noop",
                input={},
                context=CallContext(workspace="/tmp"),
                timeout_s=30,
                deadline=time.time() + 600,
                reply_to=dispatcher.reply_key,
            )

        async def checked(i: int) -> None:
            outcome = await dispatcher.call(envelope(i), "fs")
            if outcome.is_error or outcome.for_llm != "ok":  # a failed call is not a data point
                raise RuntimeError(f"bench call {i} failed: {outcome.for_llm}")

        base = 1_000_000 * self._blocks  # call ids unique across blocks (the ledger's key)
        self._blocks += 1
        for i in range(50):  # warm up
            await checked(base - 1 - i)
        times = []
        for i in range(n_sequential):
            started = time.perf_counter()
            await checked(base + i)
            times.append(time.perf_counter() - started)
        window = asyncio.Semaphore(200)

        async def one(i: int) -> None:
            async with window:
                await checked(base + 100_000 + i)

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n_concurrent)))
        return times, n_concurrent / max(time.perf_counter() - started, 1e-9)

    _blocks = 0

    def round_trips(self) -> tuple[Rounds, Rounds, dict[str, str]]:
        """(a) and (b) on one stack: clawq's no-op worker, bare Celery's solo and prefork
        workers and a raw echo all up; ROUNDS interleaved rounds of sequential round trips
        (each path's median per round), then ROUNDS of each path's throughput."""
        os.environ["BENCH_REDIS_URL"] = self.redis_url
        from bench import bare

        clawq_worker = [PY, "-m", "bench.noop", "1", os.environ.get("BENCH_POOL", "direct")]
        trips = Rounds("ms")
        rates = Rounds("calls/s", lower_is_better=False)
        every: dict[str, list[float]] = {}
        per_round = max(1, ROUND_TRIPS // ROUNDS)
        per_rate = max(1, THROUGHPUT_CALLS // ROUNDS)

        def measured(path: str, times: list[float]) -> None:
            trips.add(path, statistics.median(times) * 1e3)
            every.setdefault(path, []).extend(times)

        with (
            process(clawq_worker, self.env),
            process(bare.worker("solo"), self.env),
            process(bare.worker("prefork"), self.env),
            process([PY, "-m", "bench.echo", self.redis_url], self.env),
        ):
            wait_for(self.workers_ready("fs", 1))
            for pool in bare.POOLS:
                wait_for(lambda pool=pool: bare.ready(pool))  # type: ignore[misc]
                bare.round_trips(50, pool)  # warm up
            for _ in range(ROUNDS):
                measured(CLAWQ_CALL, asyncio.run(self.clawq_calls(per_round, 0))[0])
                for pool in bare.POOLS:
                    measured(BARE[pool], bare.round_trips(per_round, pool))
                measured(ECHO, self.raw_echo(per_round))
            self.redis.lpush("bench:req", "stop")
            for _ in range(ROUNDS):
                rates.add(CLAWQ_CALL, asyncio.run(self.clawq_calls(0, per_rate))[1])
                for pool in bare.POOLS:
                    rates.add(BARE[pool], bare.rate(per_rate, pool))
        p99 = {path: f"p99 {ms(times, 0.99):.2f} ms" for path, times in every.items()}
        return trips, rates, p99

    def raw_echo(self, n: int) -> list[float]:
        """`n` LPUSH/BRPOP echoes through `bench.echo` (the floor: two processes, Redis)."""
        times = []
        for i in range(n + 5):
            started = time.perf_counter()
            self.redis.lpush("bench:req", i)
            self.redis.brpop(["bench:resp"], timeout=10)
            if i >= 5:
                times.append(time.perf_counter() - started)
        return times

    # -- (d): horizontal scale of the runtime group -----------------------------------------

    async def exec_rate(self, calls: int, workspace: str) -> float:
        async with running_dispatcher(self.settings, f"bench-{uuid.uuid4().hex[:6]}") as dispatcher:
            return await self._exec_rate(dispatcher, calls, workspace)

    async def _exec_rate(self, dispatcher: Dispatcher, calls: int, workspace: str) -> float:
        job = uuid.uuid4().hex

        async def one(i: int) -> None:
            envelope = CallEnvelope(
                call_id=f"s{i}",
                job_id=job,
                turn=0,
                session_id=job,
                tool="exec",
                input={"command": "sleep 0.05"},
                context=CallContext(workspace=workspace),
                timeout_s=30,
                deadline=time.time() + 600,
                reply_to=dispatcher.reply_key,
            )
            outcome = await dispatcher.call(envelope, "runtime")
            assert not outcome.is_error, outcome.for_llm

        await one(-1)  # warm up every path once
        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(calls)))
        return calls / (time.perf_counter() - started)

    def scaling(self, counts: tuple[int, ...] = (1, 2, 4)) -> list[tuple[int, float]]:
        """exec `sleep 0.05` through N runtime worker processes (one executor each)."""
        workspace = tempfile.mkdtemp(prefix="clawq-bench-")
        cli = [
            PY,
            "-m",
            "orchestrator.cli",
            "worker",
            "--group",
            "runtime",
            "--concurrency",
            "1",
            "--log-level",
            "warning",
        ]
        rows = []
        for n in counts:
            with contextlib.ExitStack() as stack:
                for _ in range(n):
                    stack.enter_context(process(cli, self.env))
                wait_for(self.workers_ready("runtime", n))
                rows.append((n, asyncio.run(self.exec_rate(SCALE_CALLS * n, workspace))))
        return rows

    # -- (f): subagent admission ------------------------------------------------------------

    def admission(self) -> dict[str, float]:
        """Cost of one admission (one Lua round trip) against a bare PING, and a storm of 100
        parents x 5 children admitted by 4 threads under the seed's limits."""
        from concurrent.futures import ThreadPoolExecutor

        from broker.redis.admission import Limits, SubagentSlots

        slots = SubagentSlots(self.redis, Limits(max_concurrent=8, max_children=5))
        pings, admits = [], []
        for i in range(500):
            started = time.perf_counter()
            self.redis.ping()
            pings.append(time.perf_counter() - started)
            started = time.perf_counter()
            slots.admit(f"cost-{i}", f"cost-parent-{i}", 1)
            admits.append(time.perf_counter() - started)
            slots.release(f"cost-{i}")
        # the storm's concurrency is counted by the "children" themselves, not read back
        # from the limiter: a limiter that admitted too many would show here
        lock = threading.Lock()
        running = highest = refused = 0

        def parent(p: int) -> int:
            nonlocal running, highest, refused
            for c in range(5):
                child = f"storm-{p}-{c}"
                while not slots.admit(child, f"storm-parent-{p}", 1).admitted:
                    with lock:
                        refused += 1
                    time.sleep(0.001)
                with lock:
                    running += 1
                    highest = max(highest, running)
                time.sleep(0.005)  # the child "runs"
                with lock:
                    running -= 1
                slots.release(child)
            return 5

        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=16) as pool:
            spawned = sum(pool.map(parent, range(100)))
        storm = time.perf_counter() - started
        if highest > 8:
            raise RuntimeError(f"admission let {highest} children run at once (limit 8)")
        return {
            "ping_ms": ms(pings, 0.5),
            "admit_ms": ms(admits, 0.5),
            "spawned": spawned,
            "refused": refused,
            "storm_s": storm,
            "highest": highest,
        }

    # -- (g): a storm of real spawns --------------------------------------------------------

    def spawn_storm(self, parents: int = 100, children: int = 5) -> dict[str, float]:
        """`parents` jobs each spawning `children` subagents in one turn, through the whole
        system (sessions workers, two orchestrators), against the same jobs calling a no-op
        sessions tool instead; the running count is sampled every 5 ms."""
        from orchestrator.client import Client

        workspace = tempfile.mkdtemp(prefix="clawq-bench-")
        cli = [PY, "-m", "orchestrator.cli"]
        worker = [*cli, "worker", "--group", "sessions", "--concurrency", "4"]
        orchestrator = [*cli, "orchestrator", "--log-level", "warning"]

        def script(name: str, make_input: Callable[[int], dict[str, str]]) -> dict[str, object]:
            calls = [{"id": f"c{n}", "name": name, "input": make_input(n)} for n in range(children)]
            return {
                "turns": [{"tool_calls": calls}, {"text": "done"}],
                "subagents": {"*": {"turns": [{"text": "child done"}]}},
                "on_announce": {"turns": [{"text": "noted"}]},
            }

        spawning = script("sessions_spawn", lambda n: {"task": f"part {n}", "label": f"c{n}"})
        baseline = script("sessions_list", lambda n: {})
        with (
            process(orchestrator, self.env),
            process(orchestrator, self.env),
            process([*worker, "--log-level", "warning"], self.env),
            process([*worker, "--log-level", "warning"], self.env),
        ):
            wait_for(self.workers_ready("sessions", 8))
            client = Client(self.settings)
            highest = 0
            stop = threading.Event()

            def sample() -> None:
                nonlocal highest
                while not stop.is_set():
                    now = int(time.time() * 1000)
                    highest = max(highest, self.redis.zcount(keys.SUBAGENTS_RUNNING, now, "+inf"))
                    time.sleep(0.005)

            def storm(with_script: dict[str, object]) -> tuple[float, list[str]]:
                started = time.perf_counter()
                jobs = [
                    client.submit("storm", workspace=workspace, script=with_script)
                    for _ in range(parents)
                ]
                results = [job.wait(timeout=600) for job in jobs]
                with psycopg.connect(self.database_url) as conn:

                    def settled() -> bool:
                        row = conn.execute(
                            "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')"
                        ).fetchone()
                        return bool(row and row[0] == 0) and not self.redis.zcard(keys.ANNOUNCE_DUE)

                    wait_for(settled, timeout=600)
                outputs = [c.output for r in results for c in r.tool_calls if not c.is_error]
                return time.perf_counter() - started, outputs

            base_s, _ = storm(baseline)
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            storm_s, admitted = storm(spawning)
            stop.set()
            sampler.join()
            client.close()
        return {
            "baseline_s": base_s,
            "storm_s": storm_s,
            "admitted": len(admitted),
            "rejected": parents * children - len(admitted),
            "highest": highest,
        }

    # -- (h): MCP calls ---------------------------------------------------------------------

    def mcp_calls(self, calls: int = 100) -> dict[str, float]:
        """`mcp-server-time`'s get_current_time: on a held session in this process, with a
        new session per call, and through clawq (orchestrator → mcp worker → held session;
        queued-to-finished per call, one call per turn)."""
        from mcp import Client, StdioServerParameters

        from broker.config.mcp import parse_servers
        from orchestrator.client import Client as ClawqClient
        from workers.tools.mcp.client import McpManager

        server = os.path.join(os.path.dirname(PY), "mcp-server-time")
        args = {"timezone": "UTC"}
        manager = McpManager(
            self.settings, lambda: parse_servers({"time": {"command": server}}), lambda *_: None
        )
        manager.call("time", "get_current_time", args)
        held = []
        for _ in range(calls):
            started = time.perf_counter()
            manager.call("time", "get_current_time", args)
            held.append(time.perf_counter() - started)
        manager.close()

        async def fresh() -> float:
            started = time.perf_counter()
            async with Client(StdioServerParameters(command=server)) as client:
                await client.call_tool("get_current_time", args)
            return time.perf_counter() - started

        new = [asyncio.run(fresh()) for _ in range(5)]
        client = ClawqClient(self.settings)
        client.mcp.add({"mcpServers": {"time": {"command": server}}})
        client.mcp.grant("time", agent="main")
        cli = [PY, "-m", "orchestrator.cli"]
        turn = {"tool_calls": [{"id": "t", "name": "mcp_time__get_current_time", "input": args}]}
        script = {"turns": [turn] * calls + [{"text": "done"}]}
        with (
            process([*cli, "orchestrator", "--log-level", "warning"], self.env),
            process(
                [*cli, "worker", "--group", "mcp", "--concurrency", "1", "--log-level", "warning"],
                self.env,
            ),
        ):
            wait_for(lambda: len(client.mcp.tools()) >= 2, timeout=60)
            job = client.submit(
                "time", workspace=tempfile.mkdtemp(), script=script, max_iterations=calls + 1
            )
            job.wait(timeout=600)
            through = self.call_latencies([job.id])
        client.close()
        return {
            "held_ms": ms(held, 0.5),
            "new_ms": ms(new, 0.5),
            "clawq_ms": ms(through, 0.5),
            "clawq_p99_ms": ms(through, 0.99),
            "calls": len(through),
        }

    # -- (e): one turn of parallel safe calls -------------------------------------------

    def batch(self, size: int = 10) -> tuple[float, float]:
        """Seconds for a turn of one `exec sleep 0.1`, and for a turn of `size` of them."""
        from orchestrator.client import Client

        workspace = tempfile.mkdtemp(prefix="clawq-bench-")
        cli = [PY, "-m", "orchestrator.cli"]
        worker = [
            *cli,
            "worker",
            "--group",
            "runtime",
            "--concurrency",
            str(size),
            "--log-level",
            "warning",
        ]
        with (
            process([*cli, "orchestrator", "--log-level", "warning"], self.env),
            process(worker, self.env),
        ):
            wait_for(self.workers_ready("runtime", size))
            wait_for(
                lambda: any(p.get("kind") == "orchestrator" for p in live_processes(self.redis))
            )
            client = Client(self.settings)

            def turn_seconds(n: int) -> float:
                calls = [
                    {"id": f"c{i}", "name": "exec", "input": {"command": "sleep 0.1"}}
                    for i in range(n)
                ]
                job = client.submit(
                    "batch",
                    workspace=workspace,
                    allow=["exec"],
                    script={"turns": [{"tool_calls": calls}, {"text": "ok"}]},
                )
                job.wait(timeout=60)
                seen = [e for e in job.events() if e.type.startswith("tool_call_")]
                return max(e.at for e in seen) - min(e.at for e in seen)

            turn_seconds(size)  # warm every executor
            one = statistics.median(turn_seconds(1) for _ in range(5))
            many = statistics.median(turn_seconds(size) for _ in range(5))
            client.close()
        return one, many

    # -- (c): many jobs on one orchestrator ----------------------------------------------

    def many_jobs(self) -> dict[str, float]:
        from orchestrator.client import Client

        workspace = tempfile.mkdtemp(prefix="clawq-bench-")
        with open(os.path.join(workspace, "notes.txt"), "w") as fh:
            fh.write("a\nb\n")
        script = {
            "turns": [
                {"tool_calls": [{"id": "c1", "name": "list_files", "input": {}}]},
                {"tool_calls": [{"id": "c2", "name": "read_file", "input": {"path": "notes.txt"}}]},
                {"tool_calls": [{"id": "c3", "name": "glob", "input": {"pattern": "*.txt"}}]},
                {"text": "done"},
            ]
        }
        cli = [PY, "-m", "orchestrator.cli"]
        with (
            process([*cli, "orchestrator", "--log-level", "warning"], self.env) as orch,
            process(
                [*cli, "worker", "--group", "fs", "--concurrency", "4", "--log-level", "warning"],
                self.env,
            ),
        ):
            wait_for(self.workers_ready("fs", 4))
            wait_for(
                lambda: any(p.get("kind") == "orchestrator" for p in live_processes(self.redis))
            )
            client = Client(self.settings)
            started = time.perf_counter()
            jobs = [client.submit("bench", workspace=workspace, script=script) for _ in range(JOBS)]
            submitted = time.perf_counter() - started
            ids = [job.id for job in jobs]
            with psycopg.connect(self.database_url) as conn:

                def all_done() -> bool:
                    row = conn.execute(
                        "SELECT count(*) FROM jobs WHERE status NOT IN ('queued', 'running')"
                    ).fetchone()
                    return bool(row and row[0] >= JOBS)

                wait_for(all_done, timeout=1800)
                wall = time.perf_counter() - started
                bad = conn.execute(
                    "SELECT count(*) FROM jobs WHERE status <> 'completed'"
                ).fetchone()
            with open(f"/proc/{orch.pid}/status") as fh:
                rss_kb = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM"))
            latencies = self.call_latencies(ids)
            client.close()
        return {
            "jobs": JOBS,
            "failed": bad[0] if bad else -1,
            "submit_s": submitted,
            "wall_s": wall,
            "calls": len(latencies),
            "p50_ms": pct(latencies, 0.5) * 1e3,
            "p99_ms": pct(latencies, 0.99) * 1e3,
            "peak_rss_mb": rss_kb / 1024,
        }

    def call_latencies(self, job_ids: list[str]) -> list[float]:
        out = []
        for job_id in job_ids:
            queued: dict[str, float] = {}
            for _, fields in self.redis.xrange(keys.events(job_id)):
                event = json.loads(fields[b"e"])
                call = event["data"].get("call_id")
                if event["type"] == "tool_call_queued":
                    queued[call] = event["at"]
                elif event["type"] == "tool_call_finished" and call in queued:
                    out.append(event["at"] - queued[call])
        return out


def ms(values: list[float], q: float) -> float:
    return pct(values, q) * 1e3


def calls(bench: Bench) -> None:
    """(a) and (b): a no-op call's round trip and calls per second, against bare Celery's
    solo pool (the like-for-like baseline) with its prefork pool beside."""
    console.print(
        f"(a)/(b): {ROUND_TRIPS} sequential no-op calls per path in {ROUNDS} interleaved "
        f"rounds, then {THROUGHPUT_CALLS} concurrent; one executing process each (clawq's "
        "default pool, bare Celery's solo pool and prefork -c 1)"
    )
    trips, rates, p99 = bench.round_trips()
    solo = BARE["solo"]
    console.print(trips.table("(a) round trip of a no-op tool call", solo, p99))
    console.print(rates.table("(b) calls per second, one worker process", solo))


def main() -> None:
    bench = Bench()
    only = sys.argv[1:]  # `python -m bench web`: one section
    if only:
        try:
            sections = {
                "confinement": lambda: confinement.run(console),
                "web": lambda: web.run(console, bench, process, wait_for),
                "api": lambda: api.run(console, bench, process, wait_for),
                "memory": lambda: memory.run(console),
                "ui": lambda: ui.run(console, bench, process, wait_for),
                "messaging": lambda: messaging.run(console, bench, process, wait_for),
                "mcp-progress": lambda: mcp_progress.run(console, bench, process, wait_for),
                "parked": lambda: parked.run(console, bench, process, wait_for),
                "replay": lambda: replay.run(console, bench, process, wait_for),
                "streaming": lambda: streaming.run(console, bench, process, wait_for),
                "scrub": lambda: scrub.run(console),
                "calls": lambda: calls(bench),
                "hotpath": lambda: hotpath.run(console, bench, process, wait_for),
                "turn": lambda: hotpath.run(console, bench, process, wait_for, "i"),
                "jobs": lambda: hotpath.run(console, bench, process, wait_for, "jk"),
            }
            for name in only:
                sections[name]()
        finally:
            bench.close()
        return
    try:
        calls(bench)
        c = bench.many_jobs()
        table = Table(title=f"(c) {JOBS} concurrent scripted jobs on one orchestrator process")
        for col in (
            "jobs",
            "not completed",
            "submit s",
            "wall s",
            "calls",
            "call p50 ms",
            "call p99 ms",
            "orchestrator peak RSS MB",
        ):
            table.add_column(col, justify="right")
        table.add_row(
            str(c["jobs"]),
            str(c["failed"]),
            f"{c['submit_s']:.1f}",
            f"{c['wall_s']:.1f}",
            str(c["calls"]),
            f"{c['p50_ms']:.1f}",
            f"{c['p99_ms']:.1f}",
            f"{c['peak_rss_mb']:.0f}",
        )
        console.print(table)
        one, many = bench.batch()
        table = Table(
            title="(e) one turn of 10 concurrency-safe calls (exec sleep 0.1), 10 executors"
        )
        for col in ("turn", "seconds (median of 5)", "vs one call"):
            table.add_column(col, justify="right")
        table.add_row("1 call", f"{one:.3f}", "1.00x")
        table.add_row("10 calls", f"{many:.3f}", f"{many / one:.2f}x")
        console.print(table)
        adm = bench.admission()
        table = Table(title="(f) subagent admission (one Lua round trip per spawn)")
        for col in (
            "admit p50 ms",
            "PING p50 ms",
            "storm: 100 parents x 5 children",
            "refused attempts (a limit held)",
            "storm seconds",
            "highest concurrency, counted by the children (limit 8)",
        ):
            table.add_column(col, justify="right")
        table.add_row(
            f"{adm['admit_ms']:.3f}",
            f"{adm['ping_ms']:.3f}",
            f"{adm['spawned']:.0f} admitted",
            f"{adm['refused']:.0f}",
            f"{adm['storm_s']:.2f}",
            f"{adm['highest']:.0f}",
        )
        console.print(table)
        g = bench.spawn_storm()
        table = Table(title="(g) 100 parents x 5 real spawns, 2 orchestrators (limit 8 running)")
        for col in (
            "no-op sessions calls s",
            "spawn storm s",
            "vs no-op",
            "admitted",
            "rejected (a limit)",
            "highest concurrency",
        ):
            table.add_column(col, justify="right")
        table.add_row(
            f"{g['baseline_s']:.2f}",
            f"{g['storm_s']:.2f}",
            f"{g['storm_s'] / g['baseline_s']:.2f}x",
            f"{g['admitted']:.0f}",
            f"{g['rejected']:.0f}",
            f"{g['highest']:.0f}",
        )
        console.print(table)
        h = bench.mcp_calls()
        table = Table(title="(h) an MCP call (mcp-server-time over stdio), p50")
        for col in ("path", "ms", "vs held session"):
            table.add_column(col, justify="right")
        table.add_row("held session, in process", f"{h['held_ms']:.2f}", "1.00x")
        table.add_row(
            "new session per call", f"{h['new_ms']:.0f}", f"{h['new_ms'] / h['held_ms']:.0f}x"
        )
        table.add_row(
            f"through clawq ({h['calls']:.0f} calls, p99 {h['clawq_p99_ms']:.1f})",
            f"{h['clawq_ms']:.2f}",
            f"{h['clawq_ms'] / h['held_ms']:.2f}x",
        )
        console.print(table)
        rows = bench.scaling()
        table = Table(title="(d) runtime group scaling: exec `sleep 0.05`, N worker processes")
        for col in ("worker processes", "calls/s", "vs 1 process", "efficiency vs linear"):
            table.add_column(col, justify="right")
        base = rows[0][1]
        for n, rate in rows:
            table.add_row(str(n), f"{rate:.1f}", f"{rate / base:.2f}x", f"{rate / (base * n):.2f}")
        console.print(table)
        hotpath.run(console, bench, process, wait_for)
        confinement.run(console)
        web.run(console, bench, process, wait_for)
        api.run(console, bench, process, wait_for)
        memory.run(console)
        ui.run(console, bench, process, wait_for)
        messaging.run(console, bench, process, wait_for)
        mcp_progress.run(console, bench, process, wait_for)
        parked.run(console, bench, process, wait_for)
        replay.run(console, bench, process, wait_for)
        streaming.run(console, bench, process, wait_for)
        scrub.run(console)
    finally:
        bench.close()


if __name__ == "__main__":
    main()
