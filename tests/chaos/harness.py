"""The chaos harness: a real cluster (orchestrators, fs and runtime workers as processes) on
a Redis and a PostgreSQL of its own, jobs of scripted `exec` steps that each append one
line to a file of the job's workspace, and faults injected while they run.

Effects are counted from those files, never from clawq's records: a step whose line is
missing was lost, a step whose line is there twice was repeated (allowed only when its
runner was killed mid-call and the model's result says it ran again).

Progress is sampled every 50 ms (a new line in a job's file, or its end); a fault's
recovery is the time from the service's return to the next progress of every job that was
running then.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis

from broker.pg.store import Store
from broker.protocol import AGENT_RUN_TASK, AGENTS_QUEUE, FINAL_STATUSES, Event, JobSpec
from broker.redis.presence import live_processes
from orchestrator.cli.local.stack import Stack
from tests.chaos.services import OwnPostgres, OwnRedis

RAN_AGAIN = "ran again after its worker died"
FAULTS = ("orchestrator", "worker_process", "worker", "redis", "postgres")


@dataclass
class ChaosJob:
    id: str
    workspace: Path
    steps: int
    submitted: float
    lines: int = 0
    ended: float = 0.0
    progress: list[tuple[float, int]] = field(default_factory=list)  # (when, lines so far)

    def lines_at(self, at: float) -> int:
        return max([n for t, n in self.progress if t <= at], default=0)

    def recovered_at(self, at: float) -> float:
        """When, after `at`, a step sent after `at` had its effect (two lines more than
        then: the step in flight at `at` may have run on its own), or the job ended."""
        then = self.lines_at(at)
        later = [t for t, n in self.progress if t >= at and n >= then + 2]
        # The sampler stamps an end with the time its query began, and may store it after
        # a fault counted the job as running: an end stamped before `at` needed no recovery.
        ends = [max(self.ended, at)] if self.ended else []
        return min([*later, *ends], default=float("inf"))

    def effects(self) -> dict[str, int]:
        path = self.workspace / "effects.txt"
        found: dict[str, int] = {}
        if path.exists():
            for line in path.read_text().split():
                found[line] = found.get(line, 0) + 1
        return found


@dataclass
class Fault:
    kind: str
    at: float  # when it was injected
    back: float = 0.0  # when the service was back
    running: list[str] = field(default_factory=list)  # jobs unfinished when it was back
    held: list[str] = field(default_factory=list)  # an orchestrator's: the jobs it drove

    def resumed(self, jobs: dict[str, ChaosJob]) -> float | None:
        """An orchestrator's death: seconds from the kill to the next progress of every
        job it drove (another orchestrator resumed it)."""
        waits = [jobs[j].recovered_at(self.at) - self.at for j in self.held if j in jobs]
        return max(waits) if waits else None

    def recovery(self, jobs: dict[str, ChaosJob]) -> float | None:
        """Seconds from the service's return to the next progress of every job that was
        running then (None: no job was): a step sent after the return has had its effect.
        A step takes `step_s` of that in any case (`Chaos.step_s`)."""
        waits = [jobs[job_id].recovered_at(self.back) - self.back for job_id in self.running]
        return max(waits) if waits else None


@dataclass
class Verdict:
    lost: list[str] = field(default_factory=list)
    repeated: list[str] = field(default_factory=list)  # twice, and the model was not told
    told: list[str] = field(default_factory=list)  # twice, and the model was told
    unended: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.repeated or self.unended or self.failed)

    def __str__(self) -> str:
        return (
            f"lost {len(self.lost)} {self.lost[:5]}, repeated {len(self.repeated)}"
            f" {self.repeated[:5]}, ran again (told) {len(self.told)}, unended"
            f" {len(self.unended)} {self.unended[:5]}, failed {len(self.failed)} {self.failed[:3]}"
        )


def say(text: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {text}", flush=True)


class Chaos:
    """Services, a stack, jobs, faults. Use as a context manager."""

    def __init__(
        self,
        runtime_workers: int = 2,
        concurrency: int = 3,
        orchestrators: int = 2,
        fsync: str = "always",
        log_level: str = "warning",
        **settings: Any,
    ) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="clawq-chaos-"))
        self.redis = OwnRedis(fsync)
        self.pg = OwnPostgres()
        self.jobs: dict[str, ChaosJob] = {}
        self.faults: list[Fault] = []
        self.runtime_workers = runtime_workers
        self.concurrency = concurrency
        self.orchestrators = orchestrators
        self.log_level = log_level
        self.settings = {
            "workspace_root": str(self.root),
            "user_ceilings": {"*": {"workspace_roots": [str(self.root)]}},
            "rate_limit_per_hour": 0,
            "max_iterations": 200,
            **settings,
        }
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.quiet = threading.Event()  # set: the supervisor restarts nothing (a fault is on)

    # -- set-up --------------------------------------------------------------------------

    def __enter__(self) -> Chaos:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def env(self) -> dict[str, str]:
        env = {"CLAWQ_REDIS_URL": self.redis.url, "CLAWQ_DATABASE_URL": self.pg.url}
        for k, v in self.settings.items():
            env[f"CLAWQ_{k.upper()}"] = json.dumps(v) if isinstance(v, dict | list) else str(v)
        env["CLAWQ_SPOOL_DIR"] = str(self.root / "spool")
        return env

    def start(self) -> None:
        self.redis.start()
        self.pg.start()
        store = Store(self.pg.url)
        store.migrate()
        store.close()
        self.stack = Stack(
            ["fs", "runtime"], env=self.env(), concurrency=self.concurrency,
            log_level=self.log_level, orchestrators=self.orchestrators,
        )  # fmt: skip
        self.stack.start()
        for _ in range(self.runtime_workers - 1):  # more runtime workers than fs ones
            extra = ["--concurrency", str(self.concurrency)]
            self.stack._spawn("worker", "--group", "runtime", *extra)
        self.stack.wait_ready(self.redis.url, timeout=90)
        self.client = redis.Redis.from_url(self.redis.url, socket_timeout=2)
        for target in (self._supervise, self._sample):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        with contextlib.suppress(Exception):
            self.stack.stop()
        self.redis.stop()
        self.pg.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def _supervise(self) -> None:
        while not self._stop.wait(0.2):
            if not self.quiet.is_set():
                self.stack.supervise(lambda text: say(text) if self.log_level != "error" else None)

    # -- jobs ----------------------------------------------------------------------------

    def submit(self, steps: int, sleep_s: float = 0.2) -> ChaosJob:
        """A job of `steps` turns, each one `exec` appending its step's name to
        effects.txt after a short sleep, then a final answer."""
        job_id = os.urandom(8).hex()
        workspace = self.root / job_id
        workspace.mkdir()
        turns: list[dict[str, Any]] = [
            {
                "tool_calls": [
                    {
                        "id": f"s{k}",
                        "name": "exec",
                        # the effect in the middle: a runner killed after it is run again
                        "input": {
                            "command": f"sleep {sleep_s / 3:.3f}; echo s{k} >> effects.txt;"
                            f" sleep {2 * sleep_s / 3:.3f}; echo ok"
                        },
                    }
                ]
            }
            for k in range(steps)
        ]
        turns.append({"text": "done"})
        spec = JobSpec(
            prompt="chaos",
            model="scripted",
            script={"turns": turns},
            workspace=str(workspace),
            allow=["exec"],
            max_iterations=steps + 2,
            admin=True,
        )
        job = ChaosJob(job_id, workspace, steps, time.monotonic())
        self.jobs[job_id] = job
        _retry(lambda: self._create(job_id, spec))
        return job

    def _create(self, job_id: str, spec: JobSpec) -> None:
        from broker.celery.publisher import task_message
        from broker.redis import events

        store = Store(self.pg.url)
        try:
            store.create_job(job_id, session_id=job_id, spec=spec)
        finally:
            store.close()
        events.emit_sync(self.client, Event(type="job_queued", job_id=job_id), 3600)
        if not hasattr(self, "_app"):
            self._app = create_app_for(self.redis.url)
        raw = task_message(
            self._app, name=AGENT_RUN_TASK, queue=AGENTS_QUEUE, kwargs={"job_id": job_id},
            task_id=job_id,
        )  # fmt: skip
        self.client.lpush(AGENTS_QUEUE, raw)

    def _sample(self) -> None:
        """Every 50 ms: new lines in the jobs' files; every 0.5 s: which jobs ended."""
        last_status = 0.0
        while not self._stop.wait(0.05):
            now = time.monotonic()
            for job in list(self.jobs.values()):
                if job.ended:
                    continue
                path = job.workspace / "effects.txt"
                try:
                    lines = path.read_text().count("\n") if path.exists() else 0
                except OSError:
                    continue
                if lines > job.lines:
                    job.lines = lines
                    job.progress.append((now, lines))
            if now - last_status >= 0.5:
                last_status = now
                with contextlib.suppress(Exception):
                    self._ended(now)

    def _ended(self, now: float) -> None:
        unended = [j.id for j in self.jobs.values() if not j.ended]
        if not unended:
            return
        with psycopg.connect(self.pg.url, connect_timeout=1) as conn:
            rows = conn.execute(
                "SELECT id, status FROM jobs WHERE id = ANY(%s)", (unended,)
            ).fetchall()
        for job_id, status in rows:
            if status in FINAL_STATUSES:
                self.jobs[job_id].ended = now

    def running(self, only: set[str] | None = None) -> list[str]:
        return [j.id for j in self.jobs.values() if not j.ended and (only is None or j.id in only)]

    def wait_all(self, timeout: float, only: set[str] | None = None) -> bool:
        """Until every job (of `only`) has ended; whether they did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running(only):
                return True
            time.sleep(0.2)
        return False

    def verdict(self, only: set[str] | None = None) -> Verdict:
        """Every job ended completed; every step's line there once (or more, told)."""
        verdict = Verdict()
        store = _retry(lambda: Store(self.pg.url))
        try:
            for job in self.jobs.values():
                if only is not None and job.id not in only:
                    continue
                if not job.ended:
                    verdict.unended.append(job.id)
                result = store.job_result(job.id)
                outputs = {c.id: c.output for c in result.tool_calls} if result else {}
                ended_badly = result is not None and result.status in FINAL_STATUSES
                if ended_badly and result is not None and result.status != "completed":
                    verdict.failed.append(f"{job.id}: {result.status} {result.error}")
                found = job.effects()
                for k in range(job.steps):
                    step, count = f"s{k}", found.get(f"s{k}", 0)
                    where = f"{job.id}:{step}"
                    if count == 0:
                        if job.ended:
                            verdict.lost.append(where)
                    elif count > 1:
                        told = RAN_AGAIN in outputs.get(step, "")
                        (verdict.told if told else verdict.repeated).append(f"{where}x{count}")
        finally:
            store.close()
        return verdict

    # -- faults --------------------------------------------------------------------------

    def _indexes(self, word: str) -> list[int]:
        return [i for i, c in enumerate(self.stack.commands) if word in " ".join(c)]

    def _record(self, kind: str, at: float) -> Fault:
        fault = Fault(kind, at, time.monotonic(), self.running())
        self.faults.append(fault)
        say(f"{kind}: back after {fault.back - at:.1f} s, {len(fault.running)} jobs running")
        return fault

    def _live(self, kind: str, queue: str) -> set[str]:
        with contextlib.suppress(redis.RedisError):
            return {
                str(p.get("id"))
                for p in live_processes(self.client)
                if p.get("kind") == kind and p.get("queue") == queue
            }
        return set()

    def _replaced(self, kind: str, queue: str, dead: set[int], count: int) -> None:
        """Until `count` processes of that kind heartbeat, none of them a dead one: the
        service is back."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            live = self._live(kind, queue)
            pids = {int(proc.rsplit(":", 1)[1]) for proc in live}
            if len(live) >= count and not pids & dead:
                return
            time.sleep(0.05)
        raise TimeoutError(f"no replacement {kind} on {queue} within 60 s")

    def kill_orchestrator(self, restart_after_s: float = 2.0) -> Fault:
        """SIGKILL one orchestrator, started again `restart_after_s` later (the issue's
        operator did so); back once it heartbeats."""
        driving = {  # the one driving the most jobs: its death is felt
            i: _retry(lambda i=i: self._driven_by(self.stack.procs[i].pid))
            for i in self._indexes("orchestrator")
        }
        index = max(driving, key=lambda i: (len(driving[i]), random.random()))
        proc, held = self.stack.procs[index], driving[index]
        self.quiet.set()
        at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(restart_after_s)
        self.quiet.clear()
        self._replaced("orchestrator", AGENTS_QUEUE, {proc.pid}, self.orchestrators)
        fault = self._record("orchestrator", at)
        fault.held = held
        return fault

    def _driven_by(self, pid: int) -> list[str]:
        with psycopg.connect(self.pg.url, connect_timeout=2) as conn:
            rows = conn.execute(
                "SELECT id FROM jobs WHERE status = 'running' AND orchestrator LIKE %s",
                (f"%:{pid}",),
            ).fetchall()
        return [row[0] for row in rows]

    def worker_pids(self) -> dict[int, list[int]]:
        """Runtime worker parents → their executing processes."""
        found: dict[int, list[int]] = {}
        for index in self._indexes("--group runtime"):
            parent = self.stack.procs[index].pid
            if self.stack.procs[index].poll() is None:
                found[parent] = children_of(parent)
        return found

    def kill_worker_process(self) -> Fault:
        """SIGKILL one executing process of a runtime worker, preferably one running a
        call; its parent starts another (back once it heartbeats)."""
        busy = self.busy_pids()
        pool = [p for ps in self.worker_pids().values() for p in ps]
        choice = [p for p in pool if p in busy] or pool
        pid = random.choice(choice)
        at = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self._replaced("worker", "runtime", {pid}, self.runtime_workers * self.concurrency)
        return self._record("worker_process", at)

    def kill_worker(self, restart_after_s: float = 1.0) -> Fault:
        """SIGKILL a whole runtime worker (parent and processes at once), started again
        after `restart_after_s`; back once all its processes heartbeat."""
        index = random.choice(self._indexes("--group runtime"))
        proc = self.stack.procs[index]
        self.quiet.set()
        at = time.monotonic()
        pids = [proc.pid, *children_of(proc.pid)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        time.sleep(restart_after_s)
        self.quiet.clear()
        count = self.runtime_workers * self.concurrency
        self._replaced("worker", "runtime", set(pids), count)
        return self._record("worker", at)

    def restart_redis(self, down_s: float = 2.0) -> Fault:
        at = time.monotonic()
        self.redis.kill()
        time.sleep(down_s)
        self.redis.start()
        return self._record("redis", at)

    def restart_postgres(self, down_s: float = 2.0) -> Fault:
        at = time.monotonic()
        self.pg.crash()
        time.sleep(down_s)
        self.pg.start()
        return self._record("postgres", at)

    def inject(self, kind: str) -> Fault:
        return {
            "orchestrator": self.kill_orchestrator,
            "worker_process": self.kill_worker_process,
            "worker": self.kill_worker,
            "redis": self.restart_redis,
            "postgres": self.restart_postgres,
        }[kind]()

    def busy_pids(self) -> set[int]:
        """Pids of worker processes the ledger says are running a call now."""
        found: set[int] = set()
        with contextlib.suppress(redis.RedisError):
            for key in self.client.scan_iter(match="clawq:call:*", count=1000):
                status, proc = self.client.hmget(key, ["status", "proc"])
                if status == b"running" and proc:
                    found.add(int(proc.decode().rsplit(":", 1)[1]))
        return found

    def recoveries(self) -> dict[str, list[float]]:
        table: dict[str, list[float]] = {}
        for fault in self.faults:
            took = fault.recovery(self.jobs)
            if took is not None:
                table.setdefault(fault.kind, []).append(took)
        return table

    def step_s(self) -> float:
        """A step's usual time (the median gap between a job's lines): what any recovery
        includes once."""
        gaps = [
            b[0] - a[0]
            for job in self.jobs.values()
            for a, b in zip(job.progress, job.progress[1:], strict=False)
        ]
        return statistics.median(gaps) if gaps else 0.0

    def table(self) -> str:
        """Fault kind → how long the service was away, and the recovery after it."""
        rows = [
            "| fault | injected | service back after (s, median) | recovery after it: median"
            " / max (s) |",
            "|---|---|---|---|",
        ]
        recoveries = self.recoveries()
        for kind in FAULTS:
            faults = [f for f in self.faults if f.kind == kind]
            took = [t for t in recoveries.get(kind, []) if t != float("inf")]
            if not faults:
                continue
            away = statistics.median(f.back - f.at for f in faults)
            lost = len(recoveries.get(kind, [])) - len(took)
            worst = f"{max(took):.2f}" if took else "-"
            median = f"{statistics.median(took):.2f}" if took else "-"
            extra = f" ({lost} never recovered)" if lost else ""
            rows.append(f"| {kind} | {len(faults)} | {away:.1f} | {median} / {worst}{extra} |")
        rows.append(f"\na step takes {self.step_s():.2f} s when nothing fails (included once)")
        return "\n".join(rows)


def children_of(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            found.append(int(entry))
    return found


def create_app_for(redis_url: str) -> Any:
    from broker.celery.app import create_app
    from broker.config.settings import Settings

    return create_app(Settings(redis_url=redis_url))


def _retry(make: Callable[[], Any], seconds: float = 60.0) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        try:
            return make()
        except (psycopg.Error, redis.RedisError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
