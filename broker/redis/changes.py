"""Change notices across processes: a version counter per topic, and a pub/sub nudge.

A writer (the CLI, the API, an admin call) bumps the topic's version and publishes it;
every process that caches what the topic covers (the MCP catalog, custom tools, live
configuration) listens and reloads at once instead of at its next poll. A notice lost while
a listener was disconnected is caught up by comparing versions, so pub/sub is only the
fast path, never the only one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

import redis

from broker import keys

log = logging.getLogger("clawq.changes")
RECONNECT_S = 1.0
MCP = "mcp"  # MCP servers and grants: the mcp workers reconnect and list tools again


def announce(client: redis.Redis, topic: str) -> int:
    """Bump `topic`'s version and tell every listener; returns the new version."""
    version = int(client.incr(keys.version(topic)))
    client.publish(keys.CHANGES_CHANNEL, f"{topic}:{version}")
    return version


def version(client: redis.Redis, topic: str) -> int:
    raw = client.get(keys.version(topic))
    return int(raw) if raw else 0


class Listener:
    """A daemon thread calling `on_change(topic)` for every notice of its topics, and once
    for each topic whose version moved while it was not subscribed (it reconnects)."""

    def __init__(
        self, redis_url: str, topics: Iterable[str], on_change: Callable[[str], None]
    ) -> None:
        self.redis_url = redis_url
        self.topics = set(topics)
        self.on_change = on_change
        self.stopped = threading.Event()
        self.seen: dict[str, int] = {}
        self.thread = threading.Thread(target=self._run, name="clawq-changes", daemon=True)

    def start(self) -> Listener:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def _run(self) -> None:
        while not self.stopped.is_set():
            client = redis.Redis.from_url(self.redis_url)
            try:
                pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call,unused-ignore]
                pubsub.subscribe(keys.CHANGES_CHANNEL)
                self._catch_up(client)
                while not self.stopped.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message and isinstance(message.get("data"), bytes):
                        topic, _, number = message["data"].decode().rpartition(":")
                        if topic in self.topics:
                            self.seen[topic] = int(number or 0)
                            self._fire(topic)
                pubsub.close()
            except redis.RedisError as exc:
                log.warning("change notices: %s; reconnecting", exc)
                self.stopped.wait(RECONNECT_S)
            finally:
                client.close()

    def _catch_up(self, client: redis.Redis) -> None:
        for topic in self.topics:
            current = version(client, topic)
            if topic in self.seen and current != self.seen[topic]:
                self._fire(topic)
            self.seen[topic] = current

    def _fire(self, topic: str) -> None:
        try:
            self.on_change(topic)
        except Exception:  # a listener's bug must not end the notices
            log.exception("handling a change of %s failed", topic)
