"""Redis commands of concurrent jobs sent as one pipeline per pass of the event loop.

Each step of a job sends a command or a small pipeline (its events with a publish, the
checks that begin a turn, a lease); what the jobs send within one pass of the loop is
joined into one pipeline (broker/batching.py): the same commands, in the order they were
issued, with each caller getting its own replies (or its first error) as if it had sent
them alone.

Blocking commands, transactions and WATCH go on their own connection as before: they would
hold up every job batched with them, or need a connection of their own.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError

from broker.batching import PassBatcher

# commands that block the connection, or hold state on it
UNBATCHED = frozenset(
    {
        "BLPOP",
        "BRPOP",
        "BLMOVE",
        "BRPOPLPUSH",
        "BLMPOP",
        "BZPOPMIN",
        "BZPOPMAX",
        "BZMPOP",
        "XREAD",
        "XREADGROUP",
        "WAIT",
        "WATCH",
        "UNWATCH",
        "MULTI",
        "EXEC",
        "DISCARD",
        "SUBSCRIBE",
        "PSUBSCRIBE",
        "SELECT",
        "CLIENT",
        "MONITOR",
    }
)

Stack = list[Any]  # (args, options) of each command, as redis-py's Pipeline keeps them


class Batcher(PassBatcher[tuple[Stack, bool]]):
    """Joins the command stacks of one pass into one pipeline; each caller gets the
    replies of its own commands (its first error raised when `raise_on_error`)."""

    def __init__(self, client: aioredis.Redis, in_flight: int = 2) -> None:
        super().__init__(in_flight)
        self.client = client

    async def run(self, stack: Stack, raise_on_error: bool = True) -> list[Any]:
        return list(await self.submit((stack, raise_on_error)))

    async def send(self, items: list[tuple[Stack, bool]]) -> list[Any]:
        pipe = Pipeline(self.client.connection_pool, self.client.response_callbacks, False, None)
        for stack, _ in items:
            pipe.command_stack.extend(stack)
        replies = await pipe.execute(raise_on_error=False)
        results: list[Any] = []
        start = 0
        for stack, raise_on_error in items:
            mine = replies[start : start + len(stack)]
            start += len(stack)
            error = next((r for r in mine if isinstance(r, ResponseError)), None)
            results.append(error if raise_on_error and error is not None else mine)
        return results


class BatchedPipeline(Pipeline):
    """A non-transactional pipeline whose `execute` joins the batch of the pass."""

    batcher: Batcher

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        if self.watching or self.explicit_transaction or self.scripts:
            return await super().execute(raise_on_error)
        stack, self.command_stack = self.command_stack, []
        if not stack:
            return []
        return await self.batcher.run(stack, raise_on_error)


class BatchingRedis(aioredis.Redis):
    """A client whose commands and non-transactional pipelines are batched per pass."""

    batcher: Batcher

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if str(args[0]).upper().split(" ", 1)[0] in UNBATCHED:
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        return (await self.batcher.run([(args, options)]))[0]

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Any:
        if transaction:
            return super().pipeline(transaction, shard_hint)
        pipe = BatchedPipeline(self.connection_pool, self.response_callbacks, False, shard_hint)
        pipe.batcher = self.batcher
        return pipe


def batching(pool: aioredis.ConnectionPool) -> BatchingRedis:
    """A batching client that owns `pool` (its aclose() closes it)."""
    client = BatchingRedis(connection_pool=pool)
    client.auto_close_connection_pool = True
    client.batcher = Batcher(client)
    return client
