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

import redis

from broker.redis.presence import live_processes

BACKOFF_INITIAL_S = 1.0
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
    ) -> None:
        self.groups = list(groups)
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
        self.procs.append(subprocess.Popen(cmd, env=self.env))
        self.commands.append(cmd)
        self.started.append(time.monotonic())
        self.backoff.append(BACKOFF_INITIAL_S)

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
                self.procs[index] = subprocess.Popen(self.commands[index], env=self.env)
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

    def wait_ready(self, redis_url: str, timeout: float = 60.0) -> None:
        """Until the orchestrator and every worker process heartbeat (or one exits)."""
        client = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                for proc in self.procs:
                    if proc.poll() is not None:
                        raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
                live = live_processes(client)
                orchestrators = [p for p in live if p.get("kind") == "orchestrator"]
                queues = {p.get("queue") for p in live if p.get("kind") == "worker"}
                if len(orchestrators) >= self.orchestrators and set(self.groups) <= queues:
                    return
                time.sleep(0.2)
        finally:
            client.close()
        raise TimeoutError(f"stack not ready after {timeout}s")

    def stop(self, timeout: float = 15.0) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
