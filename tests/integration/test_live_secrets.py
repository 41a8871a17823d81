"""A secret that live configuration names is scrubbed from the next call on: a Telegram
channel applied with `clawq config apply` (its `token_env` naming a variable of the
worker's environment) sends to a local fake Bot API that echoes the bot token in an error
description, in a body and in a header, and the token reaches neither the call's output
nor the worker's log (httpx logs the URL it requested, the token in its path)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from broker.protocol import CallContext, CallEnvelope, CallOutcome
from broker.redis.presence import live_processes
from orchestrator.calls.dispatch import running_dispatcher
from tests.conftest import Isolated
from tests.integration.conftest import wait_until
from tests.sites import Reply, Seen, Site

# no vendor pattern knows this shape: only the literal, from the configuration, finds it
TOKEN = "tg-live-7Q2mXc9Lp4RzK8"
ENV = "TEST_LIVE_TG_TOKEN"
CLI = (sys.executable, "-m", "orchestrator.cli")


def fake_bot_api(seen: Seen) -> Reply:
    """Echoes the request path (the token in it) as a 404's description, a 500's text
    body, or the message id of a success, and always in a header."""
    echo = {"X-Echo": seen.path}
    text = seen.json().get("text", "")
    if text == "body":
        return Reply(500, f"upstream failed for {seen.path}".encode(), headers=echo)
    if text == "success":
        answer = {"ok": True, "result": {"message_id": f"{TOKEN}-1"}}
        return Reply(200, json.dumps(answer).encode(), "application/json", echo)
    answer = {"ok": False, "error_code": 404, "description": f"Not Found: method {seen.path}"}
    return Reply(404, json.dumps(answer).encode(), "application/json", echo)


@pytest.fixture
def telegram() -> Iterator[Site]:
    with Site({f"/bot{TOKEN}/sendMessage": fake_bot_api}) as site:
        yield site


@pytest.fixture
def worker(telegram: Site, tmp_path: Path) -> Iterator[tuple[Isolated, Path, dict[str, str]]]:
    """A messaging worker whose environment holds the token, with no channel configured;
    its log (stdout and stderr) goes to a file."""
    iso = Isolated()
    env = {
        **os.environ,
        **iso.env(),
        ENV: TOKEN,
        "CLAWQ_WEB_PRIVATE_ALLOW": json.dumps([telegram.endpoint]),
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*CLI, "worker", "--group", "messaging", "--concurrency", "1", "--log-level", "info"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: messaging_workers(iso), what="a messaging worker heartbeating")
        yield iso, log, env
    finally:
        proc.terminate()
        proc.wait(30)
        iso.drop()


def messaging_workers(iso: Isolated) -> list[dict[str, str]]:
    with redis.Redis.from_url(iso.redis_url) as client:
        return [p for p in live_processes(client) if p.get("queue") == "messaging"]


def send(iso: Isolated, text: str) -> CallOutcome:
    async def go() -> CallOutcome:
        async with running_dispatcher(iso.settings, f"test-{uuid.uuid4().hex[:6]}") as d:
            envelope = CallEnvelope(
                call_id=f"m-{uuid.uuid4().hex[:8]}",
                job_id="j-live-secrets",
                session_id="s",
                tool="message",
                input={"channel": "tg", "text": text},
                context=CallContext(workspace="/tmp"),
                timeout_s=30,
                deadline=time.time() + 60,
                reply_to=d.reply_key,
            )
            return await asyncio.wait_for(d.call(envelope, "messaging"), 60)

    return asyncio.run(go())


def test_a_channel_applied_live_never_shows_its_token(
    worker: tuple[Isolated, Path, dict[str, str]], telegram: Site
) -> None:
    iso, log, env = worker
    channel = {"tg": {"kind": "telegram", "token_env": ENV, "api_base": telegram.url}}
    channel["tg"]["default_target"] = "5001"
    subprocess.run(
        [*CLI, "config", "apply", "-"],
        input=json.dumps({"message_channels": channel}).encode(),
        env=env,
        check=True,
        capture_output=True,
    )
    # no wait for the change notice: the call itself must find the configuration moved
    error = send(iso, "description")
    body = send(iso, "body")
    success = send(iso, "success")
    assert len(telegram.seen) == 3  # each reached the provider, which echoed the token
    assert error.is_error and "Telegram sendMessage failed: Not Found: method /bot" in (
        error.for_llm
    ), error.for_llm
    assert body.is_error and "HTTP 500" in body.for_llm, body.for_llm
    assert not success.is_error and "message id" in success.for_llm, success.for_llm
    for outcome in (error, body, success):
        assert TOKEN not in outcome.for_llm and TOKEN not in outcome.for_user
        assert TOKEN not in json.dumps(outcome.metadata)
    # what the outbox keeps of each failure passed the channel's own redaction
    from broker.pg.store import Store

    store = Store(iso.database_url)
    try:
        rows = store.conn.execute("SELECT status, error FROM message_outbox").fetchall()
    finally:
        store.close()
    assert sorted(r["status"] for r in rows) == ["failed", "failed", "sent"]
    assert all(TOKEN not in r["error"] for r in rows), rows
    assert any("/bot***/sendMessage" in r["error"] for r in rows), rows
    # the worker logged the requests (httpx names each URL), with the token scrubbed
    written = wait_until(
        lambda: (text := log.read_text(errors="replace")).count("sendMessage") >= 3 and text,
        timeout=10,
        what="the worker logging its three requests",
    )
    assert TOKEN not in written, [line for line in written.splitlines() if TOKEN in line]
