"""A local stack: one orchestrator and N workers per tool group, as separate processes.

`supervise` restarts a process that died, after a backoff (1 s, doubling to 30 s, back to
1 s once it has run for a minute), as a process supervisor would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import IO

import redis

from broker.errors import RunError
from broker.redis.presence import live_processes, queues_of

BACKOFF_INITIAL_S = 1.0


class StartFailed(RunError):
    """A process of the stack ended, or did not come up, while the stack started."""


BACKOFF_MAX_S = 30.0
STABLE_S = 60.0


class Stack:
    def __init__(
        self,
        groups: Iterable[str],
        workers_per_group: int = 1,
        env: dict[str, str] | None = None,
        concurrency: int | None = None,
        log_level: str = "warning",
        orchestrators: int = 1,
        api: bool = False,
        log: IO[bytes] | None = None,
    ) -> None:
        self.groups = list(groups)  # each a worker: one group, or light ones ("fs,sessions")
        self.log = log  # the processes' output (None: this terminal's)
        self.workers_per_group = workers_per_group
        self.env = {**os.environ, **(env or {})}
        self.concurrency = concurrency
        self.log_level = log_level
        self.orchestrators = orchestrators
        self.api = api
        self.procs: list[subprocess.Popen[bytes]] = []
        self.commands: list[list[str]] = []
        self.started: list[float] = []
        self.backoff: list[float] = []
        self.due: dict[int, float] = {}  # index → when a dead process is started again

    def _spawn(self, *args: str) -> None:
        cmd = [sys.executable, "-m", "orchestrator.cli", *args, "--log-level", self.log_level]
        self.procs.append(self._popen(cmd))
        self.commands.append(cmd)
        self.started.append(time.monotonic())
        self.backoff.append(BACKOFF_INITIAL_S)

    def _popen(self, cmd: list[str]) -> subprocess.Popen[bytes]:
        """A process of the stack, in a session of its own: Ctrl-C reaches `clawq up` alone,
        which stops them in order (workers, then the orchestrators and the API)."""
        out = self.log or None
        return subprocess.Popen(cmd, env=self.env, stdout=out, stderr=out, start_new_session=True)

    def name(self, index: int) -> str:
        return " ".join(self.commands[index][3:-2])

    def supervise(self, say: Callable[[str], None]) -> None:
        """Restart every process that died once its backoff has passed; say what happens."""
        now = time.monotonic()
        for index, proc in enumerate(self.procs):
            if proc.poll() is None:
                continue
            if index not in self.due:
                if now - self.started[index] >= STABLE_S:
                    self.backoff[index] = BACKOFF_INITIAL_S
                wait = self.backoff[index]
                self.due[index] = now + wait
                self.backoff[index] = min(wait * 2, BACKOFF_MAX_S)
                say(f"{self.name(index)} exited ({proc.returncode}); restarting in {wait:g}s")
            elif now >= self.due[index]:
                del self.due[index]
                self.procs[index] = self._popen(self.commands[index])
                self.started[index] = now
                say(f"{self.name(index)} restarted (pid {self.procs[index].pid})")

    def start(self) -> None:
        for _ in range(self.orchestrators):
            self._spawn("orchestrator")
        if self.api:
            self._spawn("api")
        for group in self.groups:
            for _ in range(self.workers_per_group):
                extra = ["--concurrency", str(self.concurrency)] if self.concurrency else []
                self._spawn("worker", "--group", group, *extra)

    def wait_ready(self, redis_url: str, timeout: float = 60.0, where: str = "") -> None:
        """Until the orchestrator and every worker process heartbeat; `StartFailed` if one
        exits first or they are not up in time (`where`: their output, to read why)."""
        see = f": see {where}" if where else ""
        client = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                for index, proc in enumerate(self.procs):
                    if proc.poll() is not None:
                        raise StartFailed(
                            f"{self.name(index)} exited ({proc.returncode}) while starting{see}"
                        )
                live = live_processes(client)
                orchestrators = [p for p in live if p.get("kind") == "orchestrator"]
                queues = {q for p in live if p.get("kind") == "worker" for q in queues_of(p)}
                wanted = {g for spec in self.groups for g in spec.split(",")}
                if len(orchestrators) >= self.orchestrators and wanted <= queues:
                    return
                time.sleep(0.2)
        finally:
            client.close()
        raise StartFailed(f"the stack was not ready within {timeout:g}s{see}")

    def stop(self, timeout: float = 15.0) -> None:
        """In reverse order of their dependencies: the workers (their calls end and are
        recorded), then the API and the orchestrators; the caller stops the services last."""
        workers = [p for p, cmd in zip(self.procs, self.commands, strict=True) if "worker" in cmd]
        others = [p for p in reversed(self.procs) if p not in workers]
        for phase in (workers, others):
            for proc in phase:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for proc in phase:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
