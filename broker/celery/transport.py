"""kombu's Redis transport, without a new client object on every broker operation.

kombu's Redis channel builds a fresh `redis.Redis` for each synchronous operation (every
ack, every publish): about a quarter of a millisecond of Python each time, two or more per
task. Measured with `make bench`, this was the largest single cost of a tool call's round
trip. This channel keeps one client per connection pool; nothing else changes.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _sync_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        client = self._sync_client
        if client is None or client.connection_pool is not self.pool:  # pools reset at fork
            client = self._sync_client = super()._create_client()  # type: ignore[no-untyped-call]
        return client


class Transport(kombu_redis.Transport):
    Channel = Channel
