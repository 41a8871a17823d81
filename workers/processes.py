"""A worker of N processes that each take their calls from the queue themselves.

Celery's prefork pool consumes in its main process and hands each message to a child
through a pipe: measured here, a quarter of a no-op call's round trip (1.8 ms with prefork,
1.35 ms without) and a quarter of the worker's CPU. In a `direct` worker each process is
a whole Celery worker with the single-call pool (workers/pool.py), consuming the same
queues, the shape of dramatiq's and gunicorn's workers. This parent forks them, starts a
new one when one ends (a kill, a hard time limit, `pool_restart`), as prefork replaces a
child, passes the stop signals on, and enforces the hard time limits: each process writes
the deadline of the call it runs into memory shared with the parent, which kills it past
that (from outside, so a call stuck in C code holding the GIL is killed too, and a call
costs no thread).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

log = logging.getLogger("clawq.processes")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
QUICK_EXIT_S = 5.0  # a process that ends sooner than this is started again after a pause
BACKOFF_MAX_S = 30.0
TICK_S = 0.1  # how often the parent looks: the resolution of a hard limit
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def tie_to_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """In a child: get `sig` when the parent dies. A parent that died between the fork
    and the prctl sent nothing, so then the child exits at once."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:
        os._exit(137)


class Deadline:
    """The hard deadline (time.monotonic(), system-wide) of the call this process runs,
    as its parent sees it; 0 when it runs none."""

    def __init__(self, cells: Any, index: int) -> None:
        self._cells, self._index = cells, index

    def set(self, at: float) -> None:
        self._cells[self._index] = at

    def clear(self) -> None:
        self._cells[self._index] = 0.0


_deadline: Deadline | None = None  # in a process of a direct worker: its own


def deadline() -> Deadline | None:
    """This process's deadline cell, when its parent enforces hard limits."""
    return _deadline


@dataclass
class _Slot:
    pid: int = 0
    started: float = 0.0
    due: float = 0.0  # when to start it again, once it has ended
    pause: float = 0.0  # how long the next quick exit waits (doubling)


@dataclass
class Processes:
    """`count` processes, each running `body` (which never returns to the caller's code)."""

    count: int
    body: Callable[[], None]
    slots: list[_Slot] = field(default_factory=list)
    stopping: int = 0  # the signal that stops the worker, once one came

    def run(self) -> int:
        """Until a stop signal has been passed to every process and they have all ended."""
        self.slots = [_Slot() for _ in range(self.count)]
        self.deadlines = multiprocessing.RawArray(ctypes.c_double, self.count)  # shared
        for index in range(self.count):
            self._start(index)
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._stop)
        while any(s.pid for s in self.slots) or not self.stopping:
            self._reap()
            self._enforce_deadlines()
            now = time.monotonic()
            for index, slot in enumerate(self.slots):
                if not slot.pid and not self.stopping and now >= slot.due:
                    self._start(index)
            time.sleep(TICK_S)
        return 0

    def _start(self, index: int) -> None:
        global _deadline
        slot, parent = self.slots[index], os.getpid()
        self.deadlines[index] = 0.0
        pid = os.fork()
        if pid == 0:  # the child: a worker of its own, with the default signal handling
            code = 1
            try:
                tie_to_parent(parent, signal.SIGTERM)  # a worker without its parent stops
                for sig in STOP_SIGNALS:
                    signal.signal(sig, signal.SIG_DFL)
                _deadline = Deadline(self.deadlines, index)
                self.body()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                log.exception("worker process failed")
            finally:
                os._exit(code)
        slot.pid, slot.started = pid, time.monotonic()

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for index, slot in enumerate(self.slots):
            at = self.deadlines[index]
            if slot.pid and at and now > at:
                log.error("worker process %d passed a call's hard time limit: killed", slot.pid)
                self.deadlines[index] = 0.0
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.pid, signal.SIGKILL)

    def _reap(self) -> None:
        """Note every process that ended, and when it may start again."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            slot = next((s for s in self.slots if s.pid == pid), None)
            if slot is None:
                continue
            slot.pid = 0
            lived = time.monotonic() - slot.started
            if lived < QUICK_EXIT_S:
                slot.pause = min(max(slot.pause * 2, 1.0), BACKOFF_MAX_S)
            else:
                slot.pause = 0.0
            slot.due = time.monotonic() + slot.pause
            if not self.stopping:
                log.warning(
                    "worker process %d %s after %.1fs; starting another%s",
                    pid,
                    _describe(status),
                    lived,
                    f" in {slot.pause:g}s" if slot.pause else "",
                )

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = signum
        for slot in self.slots:
            if slot.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.pid, signum)


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with {os.waitstatus_to_exitcode(status)}"
