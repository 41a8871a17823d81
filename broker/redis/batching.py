"""Work handed in by concurrent jobs within one pass of the event loop, sent as one batch.

One orchestrator runs thousands of jobs on one event loop. A round trip to Redis or
PostgreSQL costs the process a send, a wakeup and a parse whatever it carries, so what
the jobs ask for in one pass of the loop goes together: each caller awaits its own result
(or its own error) as if it had sent alone, and a lone caller waits one pass more. While
`in_flight` batches are out, newcomers gather for the next one (group commit).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar, cast

Item = TypeVar("Item")
Result = TypeVar("Result")


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
            self.scheduled = True
            # a new task's first step runs after every job that is ready in this pass
            task = asyncio.ensure_future(self._send())
            self.sending.add(task)
            task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self.sending.discard(task)
        self._schedule()

    async def _send(self) -> None:
        self.scheduled = False
        batch, self.waiting = self.waiting, []
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


class SharedReads:
    """The same read asked for by several jobs in one pass of the loop, made once for all.

    Jobs accepted together start together and each reads its agent's context files and
    tool grants: one query answers all of them. A read is shared only by callers that
    asked before it was sent, so each still sees what was committed before it asked."""

    def __init__(self) -> None:
        self.pending: dict[Hashable, asyncio.Future[Any]] = {}

    async def read(self, key: Hashable, fetch: Callable[[], Awaitable[Result]]) -> Result:
        loop = asyncio.get_running_loop()
        future = self.pending.get(key)
        if future is None or future.get_loop() is not loop:
            future = self.pending[key] = loop.create_future()
            loop.call_soon(self._start, key, future, fetch)
        return cast(Result, await asyncio.shield(future))  # one caller's cancel is its own

    def _start(
        self, key: Hashable, future: asyncio.Future[Any], fetch: Callable[[], Awaitable[Any]]
    ) -> None:
        if self.pending.get(key) is future:
            del self.pending[key]  # later callers make a read of their own
        task = asyncio.ensure_future(fetch())

        def done(task: asyncio.Future[Any]) -> None:
            if future.done():
                return
            if task.cancelled():
                future.cancel()
            elif (exc := task.exception()) is not None:
                future.set_exception(exc)
            else:
                future.set_result(task.result())

        task.add_done_callback(done)
