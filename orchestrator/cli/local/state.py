"""How the other commands find a running `clawq up`, and how two stacks keep apart.

A stack on embedded services owns a data folder (`~/.clawq/data`, or `--data DIR`): a lock
in it held for the stack's life refuses a second stack on the same data at once, and
`stack.json` beside it says where its services listen. `~/.clawq/stack.json` names the
stack the other commands use unless `CLAWQ_DATA=DIR` names another. A state file whose
stack has stopped is said to be stale, never silently replaced by other services."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from pydantic import BaseModel, Field

from broker.config.sources import home
from broker.errors import ConfigurationError, Unavailable

DATA_VAR = "CLAWQ_DATA"  # which local stack the other commands talk to


class StackBusy(ConfigurationError):
    """A second stack on data or a port the first one holds."""


class StackStopped(Unavailable):
    """The state file names a stack that is not running."""


class StackState(BaseModel):
    redis_url: str
    database_url: str
    pid: int
    data: str
    api_url: str = ""
    settings: dict[str, str] = Field(default_factory=dict)  # digests: broker/config/loading.py

    def env(self) -> dict[str, str]:
        return {"CLAWQ_REDIS_URL": self.redis_url, "CLAWQ_DATABASE_URL": self.database_url}

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def default_data() -> Path:
    return home() / "data"


def main_state_file() -> Path:
    return home() / "stack.json"


def _read(path: Path) -> StackState | None:
    try:
        return StackState.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def _write(path: Path, state: StackState) -> None:
    """Readable by its owner only: it holds the services' URLs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(state.model_dump_json())


def find() -> StackState | None:
    """The running stack the other commands use: `CLAWQ_DATA`'s, else the main one; None
    when no state file is there; `StackStopped` when its stack is not running."""
    chosen = os.environ.get(DATA_VAR)
    path = Path(chosen).expanduser() / "stack.json" if chosen else main_state_file()
    state = _read(path)
    if state is None:
        if chosen:
            raise StackStopped(f"{DATA_VAR}={chosen}: no local stack runs on that data")
        return None
    if not state.alive():
        raise StackStopped(
            f"the local stack in {path} (pid {state.pid}) is not running: start it with"
            " `clawq up`, or name the services (CLAWQ_REDIS_URL, CLAWQ_DATABASE_URL)"
        )
    return state


class DataLock:
    """The stack's hold on its data folder, released when its process ends however it ends."""

    def __init__(self, data: Path) -> None:
        data.mkdir(parents=True, exist_ok=True)
        self.data = data
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        handle = (self.data / "lock").open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            handle.close()
            raise StackBusy(
                f"another clawq up (pid {holder}) runs on {self.data}: stop it first, or start"
                " a second stack beside it with --data DIR"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._file = handle

    def publish(self, state: StackState) -> bool:
        """Write the state file in the data folder, and the main one unless another live
        stack holds it; True when this stack is the main one."""
        _write(self.data / "stack.json", state)
        current = _read(main_state_file())
        if current is not None and current.alive() and current.pid != state.pid:
            return False
        _write(main_state_file(), state)
        return True

    def release(self) -> None:
        """Remove the state files that are this process's; the lock goes with the file."""
        for path in (self.data / "stack.json", main_state_file()):
            state = _read(path)
            if state is not None and state.pid == os.getpid():
                path.unlink(missing_ok=True)
        if self._file is not None:
            self._file.close()
            self._file = None
