"""(i) to (k): the hot path of an agent turn, through the whole system.

(i) `BENCH_TURNS` turns, each with one `list_files` call, on one orchestrator and one fs
    worker process (clawq's default pool): the median time from one `turn_started` to the
    next (model turn, transcript, gate, dispatch, worker, outcome, record), against bare
    Celery `delay().get()` of a no-op task on one worker process of Celery's default pool
    (prefork -c 1), in the same run: three jobs and three blocks of round trips,
    alternating;
(j) `BENCH_HOT_JOBS` (10,000) scripted jobs submitted at once (3 turns with one read_file
    each, then an answer) on one orchestrator process allowed to run them all at once:
    model turns per second, the highest number running at once, the orchestrator's peak
    RSS, and the CPU each kind of process took;
(k) the same load on 1 and then 2 orchestrator processes: the scaling efficiency
    (rate with 2 / twice the rate with 1). Unheld, on a 2-core machine, one orchestrator
    and the processes it keeps busy already fill the cores, so a second one has no CPU to
    scale into. (k) is therefore also run with each orchestrator held to `BENCH_ORCH_CPU`
    cores (a cgroup CPU quota, what a Kubernetes CPU limit sets): each process has a CPU of
    its own, and what is measured is whether the shared parts (Redis, PostgreSQL, the
    agents queue, the workers) let a second one add what the first adds. The quota is
    small enough that the workers, Redis and PostgreSQL serving two of them still fit in
    the machine's cores (at 0.35 cores each they did not: the machine, not the design,
    capped the second), and each held orchestrator is given `BENCH_HELD_JOBS` jobs (two
    get twice as many): an orchestrator batches what its jobs send, so its cost per turn
    falls as its load grows, and halving each one's load would measure that instead.

Jobs are submitted in bulk (the rows in one pipelined transaction, the agent runs in one
Redis pipeline): the client's own cost is not the orchestrator's. `BENCH_PROFILE=DIR` runs
py-spy on the orchestrator during (i) and (j) and writes its collapsed stacks there.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table

from bench.rounds import ROUNDS, Rounds
from broker import keys
from broker.celery.app import create_app
from broker.celery.publisher import task_message
from broker.pg.store import INSERT_JOB, INSERT_SESSION, _job_params
from broker.protocol import AGENT_RUN_TASK, AGENTS_QUEUE, Event, JobSpec
from broker.redis import events
from broker.redis.presence import live_processes

TURNS = 10 + int(os.environ.get("BENCH_TURNS", "250")) // ROUNDS  # per job of (i): 10 warm up
ROUND_TRIPS = int(os.environ.get("BENCH_ROUND_TRIPS", "1000")) // ROUNDS  # per round of (i)
HOT_JOBS = int(os.environ.get("BENCH_HOT_JOBS", "10000"))
SCALE_JOBS = int(os.environ.get("BENCH_SCALE_JOBS", str(HOT_JOBS)))
FS_WORKERS = int(os.environ.get("BENCH_FS_WORKERS", "3"))
HELD_CPU = float(os.environ.get("BENCH_ORCH_CPU", "0.2"))  # cores per held orchestrator
HELD_JOBS = int(os.environ.get("BENCH_HELD_JOBS", "3000"))
PY = sys.executable
TICK = os.sysconf("SC_CLK_TCK")


# -- process accounting -------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of one process."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by this one process."""
    found = _stat(pid)
    if found is None:
        raise ProcessLookupError(pid)
    return found[1]


def tree_cpu(roots: list[int]) -> float:
    """CPU seconds used so far by these processes and every descendant still alive."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _stat(int(entry))):
            stats[int(entry)] = found
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, list(roots)
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
        todo.extend(children.get(pid, []))
    return total


def machine_cpu() -> float:
    """CPU seconds the whole machine has been busy (all cores)."""
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / TICK


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM")) / 1024


@contextlib.contextmanager
def cpu_held(pids: list[int], cores: float) -> Iterator[None]:
    """Hold each process to `cores` CPUs with a cgroup (v1 `cpu` or v2) CFS quota of its
    own; raises OSError where cgroups cannot be written."""
    period = 100_000
    quota = int(cores * period)
    v1 = "/sys/fs/cgroup/cpu"
    made = []
    try:
        for pid in pids:
            if os.path.exists(os.path.join(v1, "cpu.cfs_quota_us")):
                group = os.path.join(v1, f"clawq-bench-{pid}")
                os.makedirs(group, exist_ok=True)
                made.append(group)
                _write(os.path.join(group, "cpu.cfs_period_us"), str(period))
                _write(os.path.join(group, "cpu.cfs_quota_us"), str(quota))
            else:
                group = f"/sys/fs/cgroup/clawq-bench-{pid}"
                os.makedirs(group, exist_ok=True)
                made.append(group)
                _write(os.path.join(group, "cpu.max"), f"{quota} {period}")
            _write(os.path.join(group, "cgroup.procs"), str(pid))
        yield
    finally:
        for group in made:
            with contextlib.suppress(OSError):
                os.rmdir(group)  # empty once its process has exited


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


# -- submitting in bulk -------------------------------------------------------------------


def submit_many(bench: Any, specs: list[JobSpec]) -> list[str]:
    """Store the jobs (one transaction, pipelined) and queue their agent runs (one
    pipeline): what `Client.submit` does, without a round trip per job."""
    ids = [uuid.uuid4().hex for _ in specs]
    pairs = list(zip(ids, specs, strict=True))
    with (
        psycopg.connect(bench.database_url, autocommit=True) as conn,
        conn.transaction(),
        conn.cursor() as cur,
    ):
        cur.executemany(INSERT_SESSION, [(i, s.agent_id, "") for i, s in pairs])
        cur.executemany(INSERT_JOB, [_job_params(i, i, s) for i, s in pairs])
    app = create_app(bench.settings)
    pipe = bench.redis.pipeline(transaction=False)
    for i in ids:
        event = Event(type="job_queued", job_id=i)
        pipe.xadd(keys.events(i), {"e": event.model_dump_json(exclude={"id"})})
        message = task_message(
            app, name=AGENT_RUN_TASK, queue=AGENTS_QUEUE, kwargs={"job_id": i}, task_id=i
        )
        pipe.lpush(AGENTS_QUEUE, message)
    pipe.execute()
    return ids


def stack_env(bench: Any, jobs: int) -> dict[str, str]:
    return {
        **bench.env,
        "CLAWQ_MAX_JOBS_PER_ORCHESTRATOR": str(jobs),
        "CLAWQ_RATE_LIMIT_PER_HOUR": "1000000",  # checked on every call, never reached
    }


def status(bench: Any, job_id: str) -> str:
    with psycopg.connect(bench.database_url) as conn:
        row = conn.execute("SELECT status FROM jobs WHERE id = %s", (job_id,)).fetchone()
    return str(row[0]) if row else ""


def ended(bench: Any, job_id: str, timeout: float) -> None:
    """Wait for the job's end as a client does, on its events stream: a poll of PostgreSQL
    opened a connection every 100 ms, a new backend forked on the cores the turns share."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        for event in events.read(bench.redis, job_id, after=last, block_ms=1000):
            last = event.id
            if event.type == "job_finished":
                return
    raise TimeoutError(f"job {job_id} did not end in {timeout} s")


def orchestrators(bench: Any) -> int:
    return sum(1 for p in live_processes(bench.redis) if p.get("kind") == "orchestrator")


# -- (i) a turn with one call ---------------------------------------------------------------


READ = {"name": "list_files", "input": {}}
WRITE = {"name": "write_file", "input": {"path": "out.txt", "content": "a line\n"}}


def one_job(bench: Any, workspace: str, call: dict[str, Any]) -> dict[str, list[float]]:
    """One job of TURNS turns with `call` each, on the running stack: the time from one
    `turn_started` to the next, and within a turn start → queued → finished → the next
    start (the first ten turns warm up)."""
    turn = {"tool_calls": [{"id": "c", **call}]}
    script = {"turns": [turn] * TURNS + [{"text": "done"}]}
    spec = JobSpec(
        prompt="turns",
        script=script,
        workspace=workspace,
        max_iterations=TURNS + 1,
        admin=True,
        permission_mode="acceptEdits",  # the write needs no approval
    )
    (job_id,) = submit_many(bench, [spec])
    ended(bench, job_id, timeout=600)
    if status(bench, job_id) != "completed":
        raise RuntimeError(f"(i)'s job ended {status(bench, job_id)}")
    started: list[float] = []
    before, calls, after = [], [], []
    queued = finished = 0.0
    for _, fields in bench.redis.xrange(keys.events(job_id)):
        event = json.loads(fields[b"e"])
        if event["type"] == "turn_started":
            if finished:
                after.append(event["at"] - finished)
            started.append(event["at"])
        elif event["type"] == "tool_call_queued":
            queued = event["at"]
            before.append(queued - started[-1])
        elif event["type"] == "tool_call_finished":
            finished = event["at"]
            calls.append(finished - queued)
    return {
        "turns": [b - a for a, b in itertools.pairwise(started)][10:],
        "before": before[10:],
        "calls": calls[10:],
        "after": after[10:],
    }


TURN_READ = "clawq turn, one list_files"
TURN_WRITE = "clawq turn, one write_file"
BARE_SOLO = "bare Celery, solo pool"
BARE_PREFORK = "bare Celery, prefork -c 1"


def one_turn(bench: Any, process: Any, wait_for: Any) -> tuple[Rounds, dict[str, str]]:
    """(i): a job of list_files turns, one of write_file turns, and bare Celery's round
    trips on its solo and prefork pools, turn about in ROUNDS rounds with every stack up;
    each path's median per round, and where a turn's time goes."""
    workspace = tempfile.mkdtemp(prefix="clawq-bench-")
    with open(os.path.join(workspace, "notes.txt"), "w") as fh:
        fh.write("a\nb\n")
    os.environ["BENCH_REDIS_URL"] = bench.redis_url
    from bench import bare

    env = stack_env(bench, 10)
    cli = [PY, "-m", "orchestrator.cli"]
    worker = [PY, "-m", "bench.noop", "1", "direct"]  # the fs tools, and a no-op (unused)
    rounds = Rounds("ms")
    parts: dict[str, dict[str, list[float]]] = {TURN_READ: {}, TURN_WRITE: {}}
    with (
        process([*cli, "orchestrator", "--log-level", "warning"], env) as orch,
        process(worker, env),
        process(bare.worker("solo"), bench.env),
        process(bare.worker("prefork"), bench.env),
    ):
        wait_for(bench.workers_ready("fs", 1))
        wait_for(lambda: orchestrators(bench) >= 1)
        for pool in bare.POOLS:
            wait_for(lambda pool=pool: bare.ready(pool))
            bare.round_trips(50, pool)  # warm up
        with profiled(orch.pid):
            for _ in range(ROUNDS):
                for path, call in ((TURN_READ, READ), (TURN_WRITE, WRITE)):
                    found = one_job(bench, workspace, call)
                    rounds.add(path, statistics.median(found["turns"]) * 1e3)
                    for name, values in found.items():
                        parts[path].setdefault(name, []).extend(values)
                for path, pool in ((BARE_SOLO, "solo"), (BARE_PREFORK, "prefork")):
                    rounds.add(path, statistics.median(bare.round_trips(ROUND_TRIPS, pool)) * 1e3)
    notes = {}
    for path, found in parts.items():
        turns = sorted(found["turns"])
        notes[path] = (
            f"p99 {turns[int(0.99 * len(turns))] * 1e3:.2f}; start→queued "
            f"{statistics.median(found['before']) * 1e3:.2f}, queued→finished "
            f"{statistics.median(found['calls']) * 1e3:.2f}, finished→next start "
            f"{statistics.median(found['after']) * 1e3:.2f}"
        )
    return rounds, notes


# -- (j) and (k): many jobs ---------------------------------------------------------------


def many_script() -> dict[str, Any]:
    turns = [
        {"tool_calls": [{"id": f"c{n}", "name": "read_file", "input": {"path": "notes.txt"}}]}
        for n in range(3)
    ]
    return {"turns": [*turns, {"text": "done"}]}


@contextlib.contextmanager
def profiled(pid: int) -> Iterator[None]:
    """py-spy's collapsed stacks of `pid` while the block runs (BENCH_PROFILE=DIR)."""
    folder = os.environ.get("BENCH_PROFILE")
    if not folder:
        yield
        return
    os.makedirs(folder, exist_ok=True)
    out = os.path.join(folder, f"orchestrator-{pid}.txt")
    spy = os.path.join(os.path.dirname(PY), "py-spy")
    args = [spy, "record", "-p", str(pid), "-f", "raw", "-o", out, "-r", "250", "--nonblocking"]
    recorder = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        recorder.send_signal(2)  # py-spy writes its file on SIGINT
        recorder.wait(30)


def many_jobs(
    bench: Any,
    process: Any,
    wait_for: Any,
    jobs: int,
    n_orchestrators: int,
    held: float | None = None,
) -> dict[str, float]:
    workspace = tempfile.mkdtemp(prefix="clawq-bench-")
    with open(os.path.join(workspace, "notes.txt"), "w") as fh:
        fh.write("a\nb\n")
    env = stack_env(bench, jobs)
    cli = [PY, "-m", "orchestrator.cli"]
    worker = [*cli, "worker", "--group", "fs", "--concurrency", str(FS_WORKERS)]
    with contextlib.ExitStack() as stack:
        orchs = [
            stack.enter_context(process([*cli, "orchestrator", "--log-level", "warning"], env))
            for _ in range(n_orchestrators)
        ]
        if held is not None:
            stack.enter_context(cpu_held([p.pid for p in orchs], held))
        fs = stack.enter_context(process([*worker, "--log-level", "warning"], env))
        wait_for(bench.workers_ready("fs", FS_WORKERS))
        wait_for(lambda: orchestrators(bench) >= n_orchestrators)
        time.sleep(1.0)  # let start-up work settle before the clock starts
        spec = JobSpec(prompt="bench", script=many_script(), workspace=workspace, admin=True)
        specs = [spec] * jobs
        conn = stack.enter_context(psycopg.connect(bench.database_url, autocommit=True))

        def count(where: str) -> int:
            row = conn.execute(f"SELECT count(*) FROM jobs WHERE {where}").fetchone()
            return int(row[0]) if row else 0

        highest, sampled = 0, 0.0

        def done() -> bool:
            """Whether every job ended: one unfinished job's index entry read, where a count
            of 10,000 took PostgreSQL 5-8 ms, ten times a second, of the 2 cores the
            stack measured shares; how many run at once is counted once a second."""
            nonlocal highest, sampled
            if time.monotonic() - sampled >= 1.0:
                highest, sampled = max(highest, count("status = 'running'")), time.monotonic()
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM jobs WHERE status IN ('queued', 'running'))"
            ).fetchone()
            return not (row and row[0])

        cpu_before = [tree_cpu([p.pid]) for p in orchs], tree_cpu([fs.pid]), machine_cpu()
        (began,) = conn.execute("SELECT clock_timestamp()").fetchone() or (None,)
        started = time.perf_counter()
        with profiled(orchs[0].pid) if n_orchestrators == 1 else contextlib.nullcontext():
            submit_many(bench, specs)
            submitted = time.perf_counter() - started
            wait_for(done, timeout=3600)
        # from the submission to the last job's end, by the database's clock (not the poll's)
        ended = conn.execute("SELECT max(finished_at) - %s FROM jobs", (began,)).fetchone()
        wall = ended[0].total_seconds() if ended and ended[0] else time.perf_counter() - started
        turns = conn.execute("SELECT sum(iterations) FROM jobs").fetchone()
        bad = count("status <> 'completed'")
        orch_cpu = sum(tree_cpu([p.pid]) - b for p, b in zip(orchs, cpu_before[0], strict=True))
        fs_cpu = tree_cpu([fs.pid]) - cpu_before[1]
        all_cpu = machine_cpu() - cpu_before[2]
        rss = max(peak_rss_mb(p.pid) for p in orchs)
    n_turns = int(turns[0]) if turns and turns[0] else 0
    return {
        "jobs": jobs,
        "failed": bad,
        "submit_s": submitted,
        "wall_s": wall,
        "turns": n_turns,
        "turns_per_s": n_turns / wall,
        "highest": highest,
        "rss_mb": rss,
        "orch_cpu": orch_cpu / wall,
        "fs_cpu": fs_cpu / wall,
        "other_cpu": (all_cpu - orch_cpu - fs_cpu) / wall,
    }


def reset(bench: Any) -> None:
    """An empty ledger and job table between runs (the bench's own db and schema)."""
    with psycopg.connect(bench.database_url, autocommit=True) as conn:
        conn.execute("TRUNCATE jobs, sessions, messages, tool_calls CASCADE")
    bench.redis.flushdb()
    bench.redis.set("clawq:bench:owner", "1")


def _cores() -> int:
    return os.cpu_count() or 1


def run(
    console: Console, bench: Any, process: Any, wait_for: Callable[..., None], parts: str = "ijk"
) -> None:
    """The sections named in `parts` ("i": one turn; "jk": many jobs, one and two
    orchestrators)."""
    if "i" in parts:
        turn(console, bench, process, wait_for)
    if "j" in parts or "k" in parts:
        many(console, bench, process, wait_for)


def turn(console: Console, bench: Any, process: Any, wait_for: Callable[..., None]) -> None:
    rounds, notes = one_turn(bench, process, wait_for)
    title = (
        f"(i) a turn with one call, end to end, against a bare Celery round trip "
        f"({TURNS - 10} turns per job, {ROUND_TRIPS} round trips per pool, each round); "
        "goals: list_files ≤ 1.5x, write_file ≤ 2x the solo pool"
    )
    console.print(rounds.table(title, BARE_SOLO, notes))


JOBS_PATH = "clawq, model turns with one read_file"
BARE_JOBS = f"bare Celery no-ops, {FS_WORKERS} solo workers"


def bare_rate(bench: Any, process: Any, wait_for: Any, n: int) -> float:
    """(j)'s baseline: as many bare Celery no-ops as (j) made turns, all sent at once, on as
    many solo-pool workers as (j) has fs worker processes."""
    os.environ["BENCH_REDIS_URL"] = bench.redis_url
    from bench import bare

    with contextlib.ExitStack() as stack:
        for _ in range(FS_WORKERS):
            stack.enter_context(process(bare.worker("solo"), bench.env))
        wait_for(lambda: bare.workers("solo") >= FS_WORKERS)
        bare.rate(100, "solo")  # warm up
        return bare.rate(n, "solo")


def many(console: Console, bench: Any, process: Any, wait_for: Callable[..., None]) -> None:
    rounds = Rounds("turns/s", lower_is_better=False)
    runs = []
    for _ in range(ROUNDS):
        reset(bench)
        j = many_jobs(bench, process, wait_for, HOT_JOBS, 1)
        runs.append(j)
        rounds.add(JOBS_PATH, j["turns_per_s"])
        reset(bench)
        rounds.add(BARE_JOBS, bare_rate(bench, process, wait_for, int(j["turns"])))
    rss = max(r["rss_mb"] for r in runs)
    per_turn = statistics.median(r["orch_cpu"] / r["turns_per_s"] * 1e3 for r in runs)
    title = (
        f"(j) {HOT_JOBS} scripted jobs at once on one orchestrator, against bare Celery; "
        "goal: ≥ 1,000 turns/s, RSS < 500 MB"
    )
    notes = {JOBS_PATH: f"peak RSS {rss:.0f} MB; orchestrator CPU {per_turn:.2f} ms per turn"}
    console.print(rounds.table(title, BARE_JOBS, notes))
    j = runs[len(runs) // 2]
    reset(bench)
    k = many_jobs(bench, process, wait_for, SCALE_JOBS, 2)
    reset(bench)
    j_scale = j if SCALE_JOBS == HOT_JOBS else many_jobs(bench, process, wait_for, SCALE_JOBS, 1)
    rows = [(1, r, 1.0) for r in runs]
    if j_scale is not j:
        rows.append((1, j_scale, 1.0))
    rows.append((2, k, k["turns_per_s"] / (2 * j_scale["turns_per_s"])))
    title = (
        f"(j)/(k) scripted jobs submitted at once (3 turns with a read_file, then an "
        f"answer); {FS_WORKERS} fs worker processes; {_cores()} cores"
    )
    console.print(jobs_table(title, rows))
    try:
        reset(bench)
        one = many_jobs(bench, process, wait_for, HELD_JOBS, 1, held=HELD_CPU)
        reset(bench)
        two = many_jobs(bench, process, wait_for, 2 * HELD_JOBS, 2, held=HELD_CPU)
    except OSError as exc:
        console.print(f"(k) held to {HELD_CPU:g} cores per orchestrator: not measured ({exc})")
        return
    title = (
        f"(k) each orchestrator held to {HELD_CPU:g} cores (a cgroup CPU quota) and given "
        f"{HELD_JOBS} jobs; "
        f"{FS_WORKERS} fs worker processes; {_cores()} cores"
    )
    held_rows = [(1, one, 1.0), (2, two, two["turns_per_s"] / (2 * one["turns_per_s"]))]
    console.print(jobs_table(title, held_rows))


def jobs_table(title: str, rows: list[tuple[int, dict[str, float], float]]) -> Table:
    table = Table(title=title)
    for col in (
        "orchestrators",
        "jobs",
        "not completed",
        "wall s",
        "turns/s",
        "most running at once",
        "peak RSS MB (per orchestrator)",
        "CPU cores: orchestrators / fs workers / rest",
        "turns per orchestrator CPU-s",
        "efficiency vs linear",
    ):
        table.add_column(col, justify="right")
    for n, r, eff in rows:
        table.add_row(
            str(n),
            f"{r['jobs']:.0f}",
            f"{r['failed']:.0f}",
            f"{r['wall_s']:.1f}",
            f"{r['turns_per_s']:.0f}",
            f"{r['highest']:.0f}",
            f"{r['rss_mb']:.0f}",
            f"{r['orch_cpu']:.2f} / {r['fs_cpu']:.2f} / {r['other_cpu']:.2f}",
            f"{r['turns_per_s'] / r['orch_cpu']:.0f}",
            f"{eff:.2f}",
        )
    return table
