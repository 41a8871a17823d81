"""A Redis and a PostgreSQL of the chaos suite's own, in temporary directories on free
ports, that it may kill and start again (the machine's shared services are never touched).

Redis runs with the append-only file fsynced on every write (`appendfsync always`), as
deploy/ runs it; PostgreSQL is a cluster made by the Debian binaries' `initdb`, run as the
`postgres` user when the suite runs as root (initdb refuses root).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import redis


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait(check: object, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except Exception:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{what} not up within {seconds}s")


class OwnRedis:
    """redis-server on a free port; `kill()` is SIGKILL, `start()` brings it back on the
    same port and directory (it reloads its append-only file)."""

    def __init__(self, fsync: str = "always") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="clawq-chaos-redis-"))
        self.port = free_port()
        self.fsync = fsync
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        cmd = [
            shutil.which("redis-server") or "/usr/bin/redis-server",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--appendonly", "yes",
            "--appendfsync", self.fsync,
            "--save", "",
            "--maxmemory-policy", "noeviction",
            "--logfile", str(self.dir / "redis.log"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def up() -> bool:
            with redis.Redis(port=self.port, socket_connect_timeout=0.5) as client:
                return bool(client.ping())

        _wait(up, 30, "redis")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"no PostgreSQL {name} under /usr/lib/postgresql/*/bin")
    return found[-1]


class OwnPostgres:
    """A PostgreSQL cluster of its own; `crash()` is an immediate stop (no checkpoint:
    recovery from the WAL at the next start), `start()` brings it back."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="clawq-chaos-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._as_user: list[str] = []
        if os.geteuid() == 0:  # initdb refuses root
            shutil.chown(self.dir, "postgres", "postgres")
            self._as_user = ["runuser", "-u", "postgres", "--"]
        self._run(_pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")

    def _run(self, *args: str) -> None:
        subprocess.run(
            [*self._as_user, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        options += " -c max_connections=300"
        self._run(
            _pg_bin("pg_ctl"), "-D", str(self.data), "-o", options,
            "-l", str(self.dir / "pg.log"), "-w", "-t", "60", "start",
        )  # fmt: skip

        def up() -> bool:
            with psycopg.connect(self.url, connect_timeout=1) as conn:
                return conn.execute("SELECT 1").fetchone() is not None

        _wait(up, 30, "postgresql")

    def crash(self) -> None:
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)
