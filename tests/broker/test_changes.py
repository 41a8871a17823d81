"""Change notices on real Redis: a bump reaches listeners at once, and a notice missed
while a listener was away is caught up from the version counter."""

from __future__ import annotations

import threading

import redis

from broker.redis import changes
from tests.conftest import Isolated


def test_an_announcement_reaches_a_listener_of_its_topic_only(isolated: Isolated) -> None:
    heard: list[str] = []
    got = threading.Event()

    def on_change(topic: str) -> None:
        heard.append(topic)
        got.set()

    listener = changes.Listener(isolated.redis_url, ["mcp"], on_change).start()
    client = redis.Redis.from_url(isolated.redis_url)
    try:
        for _ in range(50):  # until it is subscribed: the first notice it hears
            changes.announce(client, "mcp")
            if got.wait(0.1):
                break
        assert heard and set(heard) == {"mcp"}
        heard.clear()
        got.clear()
        changes.announce(client, "other-topic")
        assert changes.announce(client, "mcp") == changes.version(client, "mcp")
        assert got.wait(2) and heard == ["mcp"]
    finally:
        listener.stop()
        listener.thread.join(5)
        client.close()


def test_a_missed_notice_is_caught_up_from_the_version(isolated: Isolated) -> None:
    client = redis.Redis.from_url(isolated.redis_url)
    heard: list[str] = []
    listener = changes.Listener(isolated.redis_url, ["custom_tools", "mcp"], heard.append)
    listener._catch_up(client)  # the first look only records where things stand
    assert heard == []
    changes.announce(client, "custom_tools")  # published while nobody subscribed
    listener._catch_up(client)  # as after a reconnect
    assert heard == ["custom_tools"]
    client.close()
