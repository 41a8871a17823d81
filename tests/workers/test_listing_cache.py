"""list_files answers a listing's routed files (context files, memory) from its process's
cache only to a read running before its claim, and only while that claim finds the agent's
token as the entry holds it: a write through clawq is in the next listing wherever the old
one was cached, a read claimed first reads PostgreSQL, a Redis that lost the token matches
nothing, and a change made around clawq (SQL by hand) shows within `list_cache_s`. On a
real Redis and PostgreSQL, in a worker's runtime, as the fs worker runs calls."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from broker import keys
from broker.pg.store import Store
from broker.protocol import CallContext, CallEnvelope
from tests.conftest import Isolated
from workers.execute import WorkerRuntime, run_tool
from workers.registry import default_registry
from workers.tool import ToolContext
from workers.tools.fs import intercept
from workers.tools.fs.listing_cache import ListingCache

CACHE_S = 2.0  # long enough for a loaded machine to list twice within it


@pytest.fixture
def runtime(
    isolated: Isolated, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[WorkerRuntime]:
    monkeypatch.setattr(intercept, "LISTINGS", ListingCache())  # this test's process alone
    (workspace / "notes.txt").write_text("on disk\n")
    settings = isolated.settings.model_copy(update={"list_cache_s": CACHE_S})
    rt = WorkerRuntime.start(settings, default_registry(), "fs", "n")
    yield rt
    rt.stop()


def context(workspace: Path) -> CallContext:
    return CallContext(workspace=str(workspace), agent_id="main", user_id="alice")


def listing(rt: WorkerRuntime, workspace: Path, call_id: str, resent: bool = False) -> list[str]:
    """One list_files call of the root as the fs worker runs it: its recorded answer."""
    envelope = CallEnvelope(
        call_id=call_id,
        job_id="j",
        session_id="s",
        tool="list_files",
        input={},
        context=context(workspace),
        timeout_s=5,
        deadline=time.time() + 60,
        reply_to="replies",
        resent=resent,
    )
    outcome = rt.run_call(envelope)
    assert outcome is not None and not outcome.is_error, outcome
    recorded = rt.redis.hget(keys.call("j", 0, call_id), "outcome")
    assert recorded is not None and outcome.model_dump_json().encode() == recorded
    return outcome.for_llm.split()


def around_clawq(db: Store, name: str) -> None:
    """A context file added by SQL by hand: no writer of clawq's, no new token."""
    db.conn.execute(
        "INSERT INTO context_files (agent_id, user_id, name, content) VALUES ('main', '', %s, '')",
        (name,),
    )


def written(rt: WorkerRuntime, workspace: Path, **args: Any) -> None:
    """A write_file of another job, through the interceptors as any worker runs it."""
    ctx = ToolContext(
        context=context(workspace),
        settings=rt.settings,
        job_id="another",
        store=rt.store,
        redis=redis.Redis(connection_pool=rt.redis.connection_pool),
    )
    result = run_tool(default_registry(), "write_file", args, ctx)
    assert not result.is_error, result.for_llm


def test_a_write_through_clawq_is_in_the_next_listing_where_the_old_one_was_cached(
    runtime: WorkerRuntime, workspace: Path, db: Store
) -> None:
    assert listing(runtime, workspace, "c1") == ["notes.txt"]
    around_clawq(db, "SOUL.md")
    assert listing(runtime, workspace, "c2") == ["notes.txt"]  # answered from the cache
    written(runtime, workspace, path="MEMORY.md", content="remember this\n")
    # the cached entry is still there; its claim found a new token, so it ran again
    assert listing(runtime, workspace, "c3") == ["MEMORY.md", "SOUL.md", "notes.txt"]
    assert listing(runtime, workspace, "c4") == ["MEMORY.md", "SOUL.md", "notes.txt"]


def test_a_listing_claimed_before_it_runs_reads_postgresql(
    runtime: WorkerRuntime, workspace: Path, db: Store
) -> None:
    """Sent again (its runner died), a read runs after its claim: nothing checks a cached
    entry then, so none is used."""
    assert listing(runtime, workspace, "c1") == ["notes.txt"]
    around_clawq(db, "SOUL.md")
    assert listing(runtime, workspace, "c2", resent=True) == ["SOUL.md", "notes.txt"]


def test_a_redis_that_lost_the_token_matches_no_entry(
    runtime: WorkerRuntime, workspace: Path, db: Store
) -> None:
    assert listing(runtime, workspace, "c1") == ["notes.txt"]
    around_clawq(db, "SOUL.md")
    runtime.redis.delete(keys.routed_files("main"))  # as a Redis restarted empty would
    assert listing(runtime, workspace, "c2") == ["SOUL.md", "notes.txt"]
    assert runtime.redis.get(keys.routed_files("main"))  # the new entry's token was made


def test_a_change_made_around_clawq_shows_within_list_cache_s(
    runtime: WorkerRuntime, workspace: Path, db: Store
) -> None:
    assert listing(runtime, workspace, "c1") == ["notes.txt"]
    around_clawq(db, "SOUL.md")
    assert listing(runtime, workspace, "c2") == ["notes.txt"]
    time.sleep(CACHE_S + 0.1)
    assert listing(runtime, workspace, "c3") == ["SOUL.md", "notes.txt"]
