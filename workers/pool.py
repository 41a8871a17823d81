"""The single-call pool: a Celery worker process that runs its calls itself, in its main
thread, with the soft and hard time limits that Celery's solo pool leaves out.

Each process of a `direct` worker (workers/processes.py) is a whole Celery worker with
this pool: it takes a message from its queue and runs it, with no hand-over to a child
through a pipe. The limits are prefork's: at the soft limit `SoftTimeLimitExceeded` is
raised inside the call (SIGALRM here, SIGUSR1 there), and past the hard limit the worker's
parent kills the process (workers/processes.py), as prefork's main process kills a child;
the ledger then sends the call again, up to its delivery cap, and the parent starts a new
process.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded
from celery import signals
from celery.concurrency import solo
from celery.concurrency.base import apply_target
from celery.worker import state

from workers import processes

SINGLE_CALL_POOL = "workers.pool:SingleCallPool"  # as Celery's `worker_pool` setting names it


class SingleCallPool(solo.TaskPool):  # type: ignore[misc]
    """One call at a time, in this process, within its time limits."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        found = processes.deadline()
        if found is None:
            raise RuntimeError(f"{SINGLE_CALL_POOL} runs in the processes of a direct worker")
        self.deadline = found
        super().__init__(*args, **kwargs)
        self.on_apply = self.apply_limited
        signal.signal(signal.SIGALRM, _soft_limit_reached)

    def apply_limited(
        self,
        target: Callable[..., Any],
        args: Any = (),
        kwargs: Any = None,
        soft_timeout: float | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> None:
        """Run one task; its soft limit raises inside it, and past its hard limit the
        parent kills this process (a call that ignores the soft limit, or is stuck where
        no signal reaches it, must not hold the process forever)."""
        if timeout:
            self.deadline.set(time.monotonic() + timeout)
        if soft_timeout:
            signal.setitimer(signal.ITIMER_REAL, soft_timeout)
        try:
            apply_target(target, args, kwargs, **options)
        finally:
            if soft_timeout:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if timeout:
                self.deadline.clear()

    def restart(self) -> None:
        """`pool_restart`: this process ends after its call and its parent starts a fresh
        one, as prefork replaces its children."""
        state.should_stop = 0  # a warm shutdown with exit code 0 (EX_OK)

    def on_stop(self) -> None:
        signals.worker_process_shutdown.send(sender=None, pid=os.getpid(), exitcode=0)
        super().on_stop()


def _soft_limit_reached(signum: int, frame: FrameType | None) -> None:
    raise SoftTimeLimitExceeded()
