"""Redis commands of concurrent jobs sent as one pipeline per pass of the event loop.

Each step of a job sends a command or a small pipeline (its events with a publish, the
checks that begin a turn, a lease); what the jobs send within one pass of the loop is
joined into one pipeline (broker/redis/batching.py): the same commands, in the order they were
issued, with each caller getting its own replies (or its first error) as if it had sent
them alone.

Blocking commands, transactions and WATCH go on their own connection as before: they would
hold up every job batched with them, or need a connection of their own.

A batch's replies are read within one deadline (`timeout_s`, redis-py's default for one
reply), on connections of the batcher's own without redis-py's per-reply timeout: that
timer, made and cancelled for every reply of every command, was 7% of an orchestrator's
CPU with 10,000 jobs (py-spy; 475-540 turns/s against 550-600 without it).
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from broker.outage import async_retrying, redis_down
from broker.redis.batching import PassBatcher

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

    def __init__(
        self,
        client: aioredis.Redis,
        pool: aioredis.ConnectionPool,
        timeout_s: float,
        in_flight: int,
        outage_s: float = 0.0,
    ) -> None:
        super().__init__(in_flight)
        self.client, self.pool, self.timeout_s = client, pool, timeout_s
        self.outage_s = outage_s

    async def run(self, stack: Stack, raise_on_error: bool = True) -> list[Any]:
        return list(await self.submit((stack, raise_on_error)))

    async def send(self, items: list[tuple[Stack, bool]]) -> list[Any]:
        """The batch, sent again while Redis is away (up to `outage_s`): a job's events,
        its calls, its results must not be dropped. A batch whose replies were lost with
        their connection may run twice: a call sent twice is run once (the ledger), an
        event may be seen twice."""
        try:  # the common case costs no retry machinery
            replies = await self._execute(items)
        except Exception as exc:
            if not (self.outage_s and redis_down(exc)):
                raise
            async for attempt in async_retrying("redis batch", self.outage_s, redis_down):
                with attempt:
                    replies = await self._execute(items)
        results: list[Any] = []
        start = 0
        for stack, raise_on_error in items:
            mine = replies[start : start + len(stack)]
            start += len(stack)
            error = next((r for r in mine if isinstance(r, ResponseError)), None)
            results.append(error if raise_on_error and error is not None else mine)
        return results

    async def _execute(self, items: list[tuple[Stack, bool]]) -> list[Any]:
        pipe = Pipeline(self.pool, self.client.response_callbacks, False, None)
        for stack, _ in items:
            pipe.command_stack.extend(stack)
        try:
            async with asyncio.timeout(self.timeout_s):  # a connection cut mid-read is closed
                return list(await pipe.execute(raise_on_error=False))
        except TimeoutError as exc:
            raise RedisTimeout(f"no reply from Redis within {self.timeout_s:g}s") from exc


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

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        await self.batcher.pool.disconnect()

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


def batching(
    pool: aioredis.ConnectionPool,
    timeout_s: float = 5.0,
    in_flight: int = 2,
    outage_s: float = 0.0,
) -> BatchingRedis:
    """A batching client that owns `pool` (its aclose() closes it) and a pool of
    `in_flight` connections like it for the batches; batches wait up to `outage_s` for a
    Redis that is away."""
    client = BatchingRedis(connection_pool=pool)
    client.auto_close_connection_pool = True
    options = {**pool.connection_kwargs, "socket_timeout": None}
    batches = aioredis.BlockingConnectionPool(
        connection_class=pool.connection_class, max_connections=in_flight, **options
    )
    client.batcher = Batcher(client, batches, timeout_s, in_flight, outage_s)
    return client
