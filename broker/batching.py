"""Work handed in by concurrent jobs within one pass of the event loop, sent as one batch.

One orchestrator runs thousands of jobs on one event loop. A round trip to Redis or
PostgreSQL costs the process a send, a wakeup and a parse whatever it carries, so what
the jobs ask for in one pass of the loop goes together: each caller awaits its own result
(or its own error) as if it had sent alone, and a lone caller waits one pass more. While
`in_flight` batches are out, newcomers gather for the next one (group commit).
"""

from __future__ import annotations

import asyncio
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")


class PassBatcher(Generic[Item]):
    """Subclasses say how a batch is sent: `send` returns one result or exception per
    item, in order; an exception it raises reaches every caller of the batch."""

    def __init__(self, in_flight: int = 2) -> None:
        self.in_flight = in_flight
        self.waiting: list[tuple[Item, asyncio.Future[Any]]] = []
        self.sending: set[asyncio.Task[None]] = set()
        self.scheduled = False

    async def send(self, items: list[Item]) -> list[Any]:
        raise NotImplementedError

    async def submit(self, item: Item) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting.append((item, future))
        self._schedule()
        return await future

    def _schedule(self) -> None:
        if self.waiting and not self.scheduled and len(self.sending) < self.in_flight:
            self.scheduled = True  # runs after every job that is ready in this pass
            asyncio.get_running_loop().call_soon(self._start)

    def _start(self) -> None:
        self.scheduled = False
        batch, self.waiting = self.waiting, []
        if batch:
            task = asyncio.ensure_future(self._send(batch))
            self.sending.add(task)
            task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self.sending.discard(task)
        self._schedule()

    async def _send(self, batch: list[tuple[Item, asyncio.Future[Any]]]) -> None:
        try:
            results = await self.send([item for item, _ in batch])
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():  # its caller was cancelled
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
