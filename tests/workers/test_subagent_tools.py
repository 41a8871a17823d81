"""The pure parts of the subagent tools: the steer cut, target lookup, the listing."""

from __future__ import annotations

import json

import pytest
import redis

from broker import keys
from broker.pg.store import Store
from broker.protocol import CallContext, JobSpec
from tests.conftest import Isolated
from workers.tool import ToolContext, ToolError
from workers.tools.sessions.subagents import (
    SpawnInput,
    Subagents,
    SubagentsInput,
    _find,
    _listing,
    cut_utf8,
)


def child(id_: str, label: str, status: str = "running", **more: object) -> dict[str, object]:
    row: dict[str, object] = {
        "id": id_,
        "label": label,
        "status": status,
        "depth": 1,
        "archived": False,
        "final_text": "",
        "error": "",
    }
    return row | more


def test_cut_keeps_whole_characters() -> None:
    assert cut_utf8("é" * 3000, 4000) == "é" * 2000
    assert cut_utf8("aé", 2) == "a"  # never half a character
    assert cut_utf8("short", 4000) == "short"


def test_targets() -> None:
    rows = [child("a1b2c3d4e5", "scout"), child("f6e7d8c9b0", "scout"), child("9999999999", "x")]
    assert _find(rows, "last")["id"] == "9999999999"
    assert _find(rows, "a1b2c3d4e5")["id"] == "a1b2c3d4e5"
    assert _find(rows, "f6e7d8")["id"] == "f6e7d8c9b0"  # a unique prefix
    assert _find(rows, "scout")["id"] == "f6e7d8c9b0"  # a label: its latest child
    with pytest.raises(ToolError, match="no subagent 'f6e'"):
        _find(rows, "f6e")  # too short to be an id prefix, and no such label
    with pytest.raises(ToolError, match="no subagents"):
        _find([], "last")


def test_listing_and_mode_names() -> None:
    rows = [
        child("c1", "a", "completed", final_text="found it\nmore"),
        child("c2", "b", "cancelled", archived=True),
    ]
    assert _listing(rows).splitlines() == [
        "c1  'a'  completed  depth 1  → found it",
        "c2  'b'  archived  depth 1",
    ]
    assert _listing([]) == "no subagents"
    assert SpawnInput(task="t", mode="run").mode == "sync"  # the seed's name
    assert SpawnInput(task="t", mode="spawn").mode == "async"


def test_cancel_by_id_signals_the_child(
    isolated: Isolated, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a real Redis and PostgreSQL, without an orchestrator: the cancel flag is set and
    published, and the answer says the child has not stopped yet."""
    import workers.tools.sessions.subagents as subagents

    monkeypatch.setattr(subagents, "STOP_WAIT_S", 0.3)
    store = Store(isolated.database_url)
    client = redis.Redis.from_url(isolated.redis_url)
    try:
        store.create_job("parent", "parent", JobSpec(prompt="p", workspace="/tmp"))
        for name in ("one", "two"):
            spec = JobSpec(
                prompt="c",
                workspace="/tmp",
                parent_id="parent",
                parent_session="parent",
                depth=1,
                label=name,
            )
            store.create_job(f"child-{name}-0123456789", f"child-{name}-0123456789", spec)
        control = client.pubsub()
        control.subscribe(keys.CONTROL_CHANNEL)
        control.get_message(timeout=1)
        ctx = ToolContext(
            context=CallContext(workspace="/tmp"),
            settings=isolated.settings,
            job_id="parent",
            session_id="parent",
            store=lambda: store,
            redis=client,
            celery=lambda: None,  # type: ignore[arg-type,return-value]
        )
        result = Subagents().run(
            SubagentsInput(action="cancel", target="child-two-0123456789"), ctx
        )
        assert result.for_llm == (
            "cancelled 1 subagent(s): two (child-two-0123456789); still stopping: two"
        )
        assert client.get(keys.cancel("child-two-0123456789")) == b"cancelled by its parent"
        assert client.get(keys.cancel("child-one-0123456789")) is None
        message = control.get_message(timeout=2)
        assert message and json.loads(message["data"]) == {"cancel": "child-two-0123456789"}
        control.close()
    finally:
        client.close()
        store.close()


def test_a_spawn_run_again_for_its_call_makes_no_second_child(isolated: Isolated) -> None:
    """The ledger runs a call again when its process was taken for dead (its heartbeat
    lapsed under load): the second run of a spawn finds the child the first made. On a real
    Redis and PostgreSQL, the agent run published to the real `agents` queue."""
    from broker.celery.app import create_app
    from workers.tools.sessions.subagents import spawn

    store = Store(isolated.database_url)
    client = redis.Redis.from_url(isolated.redis_url)
    app = create_app(isolated.settings)
    try:
        spec = JobSpec(prompt="p", workspace="/tmp", model="openai/gpt-4o-mini")
        store.create_job("parent", "parent", spec)

        def run(call_id: str) -> str:
            ctx = ToolContext(
                context=CallContext(workspace="/tmp"),
                settings=isolated.settings,
                job_id="parent",
                turn=1,
                call_id=call_id,
                session_id="parent",
                store=lambda: store,
                redis=client,
                celery=lambda: app,
            )
            return spawn(ctx, "look around", "scout", announce=True)

        first = run("s1")
        assert run("s1") == first  # the same call, run again
        other = run("s2")
        assert other != first
        rows = store.conn.execute(
            "SELECT id FROM jobs WHERE parent_id = 'parent' ORDER BY id"
        ).fetchall()
        assert sorted(r["id"] for r in rows) == sorted([first, other])
        assert client.scard(keys.subagent_children("parent")) == 2  # counted once each
        assert client.zcard(keys.SUBAGENTS_RUNNING) == 2
    finally:
        app.close()
        client.close()
        store.close()
