"""The batching Redis client, on a real Redis: concurrent callers share round trips and
still get their own replies and errors."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from broker.redis.autopipe import BatchingRedis, batching
from broker.redis.batching import SharedReads
from tests.conftest import Isolated


def run(isolated: Isolated, test: Callable[[BatchingRedis], Awaitable[None]]) -> None:
    """`test` with a batching client of its own, on the test's Redis db."""

    async def go() -> None:
        pool = aioredis.BlockingConnectionPool.from_url(isolated.redis_url, max_connections=4)
        client = batching(pool)
        try:
            await test(client)
        finally:
            await client.aclose()

    asyncio.run(go())


def count_sends(client: BatchingRedis) -> list[int]:
    """How many commands each pipeline the batcher sent carried."""
    sizes: list[int] = []
    send = client.batcher.send

    async def counted(items: list[Any]) -> list[Any]:
        sizes.append(sum(len(stack) for stack, _ in items))
        return await send(items)

    client.batcher.send = counted  # type: ignore[method-assign]
    return sizes


def test_concurrent_commands_share_one_round_trip(isolated: Isolated) -> None:
    async def body(client: BatchingRedis) -> None:
        sizes = count_sends(client)
        replies = await asyncio.gather(*(client.incr(f"k{i % 10}") for i in range(100)))
        assert sorted(replies) == sorted([n for n in range(1, 11) for _ in range(10)])
        assert len(sizes) <= 2 and sum(sizes) == 100  # not 100 round trips
        assert int(await client.get("k3") or 0) == 10

    run(isolated, body)


def test_each_caller_gets_its_own_replies_in_order(isolated: Isolated) -> None:
    async def body(client: BatchingRedis) -> None:
        async def job(n: int) -> list[object]:
            async with client.pipeline(transaction=False) as pipe:
                pipe.rpush(f"list{n}", *range(n + 1))
                pipe.lrange(f"list{n}", 0, -1)
                return list(await pipe.execute())

        results = await asyncio.gather(*(job(n) for n in range(20)))
        for n, (length, items) in enumerate(results):
            assert length == n + 1
            assert items == [str(i).encode() for i in range(n + 1)]

    run(isolated, body)


def test_an_error_reaches_only_its_caller(isolated: Isolated) -> None:
    async def body(client: BatchingRedis) -> None:
        await client.set("text", "x")

        async def wrong() -> str:
            try:
                await client.lpush("text", "y")  # WRONGTYPE
            except ResponseError as exc:
                return f"raised {exc}"
            return "returned"

        results = await asyncio.gather(client.incr("n"), wrong(), client.incr("n"))
        assert str(results[1]).startswith("raised WRONGTYPE")
        assert sorted(r for r in results if isinstance(r, int)) == [1, 2]

        async with client.pipeline(transaction=False) as pipe:  # raise_on_error=False: inline
            pipe.lpush("text", "y").incr("n")
            error, n = await pipe.execute(raise_on_error=False)
        assert isinstance(error, ResponseError) and n == 3

    run(isolated, body)


def test_a_blocking_read_does_not_hold_up_the_batch(isolated: Isolated) -> None:
    async def body(client: BatchingRedis) -> None:
        # two blocking reads, each started in a pass of its own: batched, they would hold
        # both of the batcher's pipelines in flight for two seconds
        blocked = [asyncio.ensure_future(client.brpop(["empty0"], timeout=2))]
        await asyncio.sleep(0.05)
        blocked.append(asyncio.ensure_future(client.brpop(["empty1"], timeout=2)))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        assert await client.set("quick", "1")
        assert time.monotonic() - started < 1.0  # not after the two-second BRPOPs
        await client.lpush("empty0", "v")
        await client.lpush("empty1", "w")
        assert [await b for b in blocked] == [(b"empty0", b"v"), (b"empty1", b"w")]

    run(isolated, body)


def test_transactions_still_run_atomically(isolated: Isolated) -> None:
    async def body(client: BatchingRedis) -> None:
        async with client.pipeline(transaction=True) as pipe:
            pipe.set("a", "1").incr("a")
            assert await pipe.execute() == [True, 2]
        # all or nothing: a command refused when queued aborts the whole transaction
        async with client.pipeline(transaction=True) as pipe:
            pipe.set("b", "1").execute_command("SET", "c")  # SET with too few arguments
            with pytest.raises(ResponseError):
                await pipe.execute()
        assert await client.get("b") is None

    run(isolated, body)


def test_a_cancelled_caller_leaves_the_others_whole(isolated: Isolated) -> None:
    async def body(client: BatchingRedis) -> None:
        first = asyncio.ensure_future(client.incr("c"))
        second = asyncio.ensure_future(client.incr("c"))
        await asyncio.sleep(0)  # both are in the batch, not yet sent
        first.cancel()
        assert await asyncio.wait_for(second, 5) in (1, 2)
        with pytest.raises(asyncio.CancelledError):
            await first

    run(isolated, body)


def test_identical_reads_of_one_pass_are_made_once() -> None:
    made: list[str] = []

    async def go() -> None:
        reads = SharedReads()

        async def fetch(key: str) -> dict[str, str]:
            made.append(key)
            await asyncio.sleep(0.01)
            return {"key": key}

        together = await asyncio.gather(
            *(reads.read(k, functools.partial(fetch, k)) for k in ["a", "a", "b", "a"])
        )
        assert [r["key"] for r in together] == ["a", "a", "b", "a"]
        assert sorted(made) == ["a", "b"]  # one read per key for the whole pass
        # a read already sent is not joined: who asks later gets a read of its own
        first = asyncio.ensure_future(reads.read("a", lambda: fetch("a")))
        await asyncio.sleep(0.001)
        second = await reads.read("a", lambda: fetch("a"))
        assert (await first) == second and made.count("a") == 3

    asyncio.run(go())


def test_a_failed_shared_read_fails_each_caller() -> None:
    async def go() -> None:
        reads = SharedReads()

        async def broken() -> None:
            raise ValueError("no database")

        results = await asyncio.gather(
            reads.read("k", broken), reads.read("k", broken), return_exceptions=True
        )
        assert all(isinstance(r, ValueError) for r in results)

    asyncio.run(go())


class HeldReplies:
    """A TCP relay to the test's Redis whose replies can be held back: a Redis that is
    late, without keeping the shared Redis busy and without a clock to wait out."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.db = parts.hostname or "", parts.port or 6379, parts.path
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.relay, "127.0.0.1", 0)
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}{self.db}"

    async def relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, held: bool) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    if held:
                        await self.flowing.wait()
                    dst.write(data)
                    await dst.drain()
            dst.close()

        for task in (pipe(reader, up_writer, False), pipe(up_reader, writer, True)):
            self.tasks.add(asyncio.ensure_future(task))

    async def close(self) -> None:
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for writer in self.writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        await self.server.wait_closed()


def test_a_batch_whose_replies_are_late_fails_and_the_next_one_is_answered(
    isolated: Isolated,
) -> None:
    """One deadline for the whole batch: a Redis whose replies are late past it is a Redis
    TimeoutError for every caller of the batch, and the connection it cut is not handed
    out again (its late replies, let through afterwards, never answer a later command)."""

    async def go() -> None:
        relay = HeldReplies(isolated.redis_url)
        url = await relay.start()
        pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=4)
        client = batching(pool, timeout_s=0.1)
        try:
            assert await client.get("k") is None  # connected (its handshake answered)
            relay.flowing.clear()  # Redis runs the batch; its replies wait
            async with asyncio.timeout(5):  # without its own deadline the batch would wait
                late = await asyncio.gather(
                    client.incr("k"), client.incr("k"), return_exceptions=True
                )
            assert all(isinstance(r, RedisTimeout) for r in late), late
            relay.flowing.set()  # the late replies go out, to a connection now closed
            assert await client.incr("k") == 3  # the batch ran; this is a fresh reply
            assert await client.get("k") == b"3"
        finally:
            await client.aclose()
            await relay.close()

    asyncio.run(go())
