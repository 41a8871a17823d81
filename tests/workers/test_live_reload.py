"""A worker follows live configuration before each call, not only when the change notice
arrives: a call sent right after `config apply` runs under it, and its result is scrubbed
of the secrets it names. The runtime here has no notice listener at all, so only the
check at the call can have loaded the change."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from broker import keys
from broker.config import live as live_config
from broker.config.settings import Settings
from broker.pg.store import Store
from broker.protocol import CallContext, CallEnvelope
from broker.redis import changes
from broker.redis.ledger import Ledger
from tests.conftest import Isolated
from tests.sites import Reply, Seen, Site
from workers.egress.client import egress_for
from workers.execute import WorkerRuntime
from workers.outcomes import Outcomes
from workers.registry import default_registry
from workers.scrub import Scrubber, secrets_of

TOKEN = "tg-live-3Hq8Wv1Nc6Tx"  # no vendor pattern knows it: only the literal finds it


@pytest.fixture
def telegram() -> Iterator[Site]:
    def echo(seen: Seen) -> Reply:
        return Reply(200, json.dumps({"ok": True, "result": {"message_id": TOKEN}}).encode())

    with Site({f"/bot{TOKEN}/sendMessage": echo}) as site:
        yield site


def test_a_change_applied_before_a_call_is_in_force_for_it(
    isolated: Isolated, telegram: Site, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TEST_RELOAD_TG_TOKEN", TOKEN)
    base = isolated.settings.model_copy(update={"web_private_allow": [telegram.endpoint]})
    client = redis.Redis.from_url(base.redis_url)
    runtime = worker(base, client, "messaging", tmp_path)
    runtime.reload_settings()  # nothing applied yet: the environment rules
    assert runtime.config_version == 0 and not runtime.settings.message_channels
    store = Store(base.database_url)
    channel = {"kind": "telegram", "token_env": "TEST_RELOAD_TG_TOKEN"}
    channel |= {"api_base": telegram.url, "default_target": "42"}
    live_config.LiveConfigStore(store.conn).apply(base, {"message_channels": {"tg": channel}}, "t")
    store.close()
    changes.announce(client, live_config.TOPIC)
    outcome = runtime.run_call(envelope("send", {"channel": "tg", "text": "hi"}))
    assert outcome is not None and not outcome.is_error, outcome
    assert telegram.paths() == [f"/bot{TOKEN}/sendMessage"]  # the channel was in force
    assert outcome.for_llm == "sent to tg:42; message id [REDACTED]"  # and its token known
    assert TOKEN not in json.dumps(outcome.metadata)
    runtime.store().close()
    egress_for(runtime.settings).close()
    client.close()


def test_a_read_that_reaches_the_network_waits_for_the_configuration_in_force(
    isolated: Isolated, tmp_path: Path
) -> None:
    """A read runs before its claim, but the claim brings the configuration's
    version: a web_fetch waits for it, so a site taken off the allowed list before the call
    was sent is never contacted (no change notice is sent here: only the claim can tell)."""
    page = Reply(200, b"<html><body><p>the page</p></body></html>", "text/html")
    with Site({"/page": page}) as site:
        base = isolated.settings.model_copy(update={"web_private_allow": [site.endpoint]})
        client = redis.Redis.from_url(base.redis_url)
        runtime = worker(base, client, "web", tmp_path)
        runtime.reload_settings()
        fetched = runtime.run_call(envelope("f1", {"url": site.url + "/page"}, "web_fetch"))
        assert fetched is not None and "the page" in fetched.for_llm, fetched
        assert site.paths() == ["/page"]
        store = Store(base.database_url)
        live_config.LiveConfigStore(store.conn).apply(
            base, {"web_allow_domains": ["example.com"]}, "t"
        )
        store.close()
        client.incr(keys.version(live_config.TOPIC))  # applied; its notice not yet heard
        refused = runtime.run_call(envelope("f2", {"url": site.url + "/page?2"}, "web_fetch"))
        assert (
            refused is not None and refused.is_error and "not on the allowed" in refused.for_llm
        ), refused
        assert site.paths() == ["/page"]  # never contacted under the old lists
        assert runtime.settings.web_allow_domains == ["example.com"]
        egress_for(runtime.settings).close()
        runtime.store().close()
        client.close()


def worker(base: Settings, client: redis.Redis, queue: str, tmp_path: Path) -> WorkerRuntime:
    """A worker process's runtime in this process, with no change-notice listener: only the
    check at the call can load a change."""
    ledger = Ledger(client, 600)
    return WorkerRuntime(
        base,
        default_registry(),
        queue,
        f"worker:test:{queue}",
        client,
        ledger,
        heartbeat=None,  # type: ignore[arg-type]  # not used by a call
        scrub=Scrubber(secrets_of(base)),
        outcomes=Outcomes(ledger, client, str(tmp_path / "spool"), base.outage_retry_s),
        base_settings=base,
    )


def envelope(call_id: str, input_: dict[str, Any], tool: str = "message") -> CallEnvelope:
    return CallEnvelope(
        call_id=call_id,
        job_id="j",
        session_id="s",
        tool=tool,
        input=input_,
        context=CallContext(workspace="/tmp"),
        timeout_s=30,
        deadline=time.time() + 60,
        reply_to="test:replies",
    )
