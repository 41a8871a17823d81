"""A message whose worker is SIGKILLed after Telegram accepted it, and before the worker
heard back, is delivered again by Celery (late acks), and the chat still gets exactly one
message: the outbox row says an attempt died while the provider had it, so the redelivered
call sends nothing and tells the model so. The receiver is a local server speaking the
Bot API's documented sendMessage shape."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from broker.pg.store import Store
from broker.redis.presence import live_processes
from tests.integration.conftest import Cluster, start_cluster
from tests.sites import Reply, Seen, Site

TOKEN = "987654:E2E-token"


class KillingTelegram:
    """sendMessage: the first one kills the messaging worker process that sent it."""

    def __init__(self) -> None:
        self.messages: list[dict[str, object]] = []
        self.redis_url = ""
        self.lock = threading.Lock()

    def __call__(self, seen: Seen) -> Reply:
        with self.lock:
            self.messages.append(seen.json())
            first = len(self.messages) == 1
        if first:
            with redis.Redis.from_url(self.redis_url) as client:
                for proc in live_processes(client):
                    if proc.get("queue") == "messaging" and proc.get("kind") == "worker":
                        os.kill(int(proc["pid"]), signal.SIGKILL)
        answer = {"ok": True, "result": {"message_id": len(self.messages)}}
        return Reply(200, json.dumps(answer).encode(), "application/json")


@pytest.fixture(scope="module")
def telegram() -> Iterator[tuple[KillingTelegram, Site]]:
    handler = KillingTelegram()
    with Site({f"/bot{TOKEN}/sendMessage": handler}) as site:
        yield handler, site


@pytest.fixture(scope="module")
def cluster(telegram: tuple[KillingTelegram, Site]) -> Iterator[Cluster]:
    handler, site = telegram
    os.environ["TEST_E2E_TG_TOKEN"] = TOKEN  # the workers inherit it
    channels = {
        "tg": {
            "kind": "telegram",
            "token_env": "TEST_E2E_TG_TOKEN",
            "api_base": site.url,
            "default_target": "5001",
        }
    }
    for c in start_cluster(
        groups=("messaging",),
        concurrency=1,  # one executing process: the one the receiver kills
        message_channels=channels,
        web_private_allow=[site.endpoint],
    ):
        handler.redis_url = c.iso.redis_url
        yield c


def test_a_send_killed_after_the_provider_took_it_arrives_once(
    cluster: Cluster, telegram: tuple[KillingTelegram, Site], workspace: Path
) -> None:
    handler, _ = telegram
    job = cluster.client.submit(
        "tell the ops chat",
        workspace=str(workspace),
        allow=["message"],
        script={
            "turns": [
                {
                    "tool_calls": [
                        {
                            "id": "m1",
                            "name": "message",
                            "input": {"channel": "tg", "text": "the nightly build failed"},
                        }
                    ]
                },
                {"text": "done"},
            ]
        },
    )
    (call,) = job.wait(timeout=90).tool_calls
    assert handler.messages == [{"chat_id": "5001", "text": "the nightly build failed"}]
    assert call.is_error and "unknown" in call.output and "not sent again" in call.output
    store = Store(cluster.iso.database_url)
    try:
        row = store.conn.execute(
            "SELECT o.status, o.attempts, o.session_id, j.session_id AS job_session"
            " FROM message_outbox o JOIN jobs j ON j.id = o.job_id WHERE o.job_id = %s",
            (job.id,),
        ).fetchone()
        assert row is not None and (row["status"], row["attempts"]) == ("unknown", 2)
        assert row["session_id"] == row["job_session"] != ""  # whose message it is: edits ask
    finally:
        store.close()
