"""A local stack: one orchestrator and N workers per tool group, as separate processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable

import redis

from broker.presence import live_processes


class Stack:
    def __init__(
        self,
        groups: Iterable[str],
        workers_per_group: int = 1,
        env: dict[str, str] | None = None,
        concurrency: int | None = None,
        log_level: str = "warning",
        orchestrators: int = 1,
    ) -> None:
        self.groups = list(groups)
        self.workers_per_group = workers_per_group
        self.env = {**os.environ, **(env or {})}
        self.concurrency = concurrency
        self.log_level = log_level
        self.orchestrators = orchestrators
        self.procs: list[subprocess.Popen[bytes]] = []

    def _spawn(self, *args: str) -> None:
        cmd = [sys.executable, "-m", "orchestrator.cli", *args, "--log-level", self.log_level]
        self.procs.append(subprocess.Popen(cmd, env=self.env))

    def start(self) -> None:
        for _ in range(self.orchestrators):
            self._spawn("orchestrator")
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

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

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
