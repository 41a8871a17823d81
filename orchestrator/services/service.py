"""What a background duty of the orchestrator is: started with the process, stopped with it,
in the manner of Celery's bootsteps. A periodic one sleeps, then ticks; a tick that fails is
logged and the next one comes (a duty never takes the process down)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from broker import outage

log = logging.getLogger("clawq.orchestrator")


class Service:
    name = "service"

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.task = asyncio.create_task(self.run(), name=f"clawq-{self.name}")

    async def run(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        if self.task is None:
            return
        self.task.cancel()
        # bounded: redis-py can lose a cancellation that lands in a blocking read
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([self.task], timeout=3)


class Periodic(Service):
    """A duty done every `interval_s`."""

    interval_s = 1.0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.tick()
            except Exception as exc:  # tried again at the next tick
                outage.report(log, self.name, exc)

    async def tick(self) -> None:
        raise NotImplementedError
