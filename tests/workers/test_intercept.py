"""The fs tools' interceptors on real PostgreSQL and Redis: context files routed by agent
kind with the user/agent fallback, BOOTSTRAP.md deleted by an empty write, memory with
the user's copy over the global one, version conflicts, and a database error refusing
the write. In every case the workspace disk stays untouched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from broker.pg.store import Store
from broker.protocol import CallContext
from broker.stores.context_files import ContextFileStore
from broker.stores.memory import MemoryStore
from tests.conftest import Isolated
from workers.execute import run_tool
from workers.registry import default_registry
from workers.tool import ToolContext, ToolResult
from workers.tools.fs.intercept import Memory, listed

REGISTRY = default_registry()


class Job:
    """Calls fs tools as one job of an agent and a user, like a worker does."""

    def __init__(self, iso: Isolated, store: Store, ws: Path, job: str, agent: str, user: str):
        self.iso, self.store, self.ws = iso, store, ws
        self.job, self.agent, self.user = job, agent, user
        self.redis = redis.Redis.from_url(iso.redis_url)

    def __call__(self, tool: str, **raw: Any) -> ToolResult:
        ctx = ToolContext(
            context=CallContext(workspace=str(self.ws), agent_id=self.agent, user_id=self.user),
            settings=self.iso.settings,
            job_id=self.job,
            store=lambda: self.store,
            redis=self.redis,
        )
        return run_tool(REGISTRY, tool, raw, ctx)


@pytest.fixture
def job(isolated: Isolated, db: Store, workspace: Path) -> Any:
    def make(name: str = "j1", agent: str = "main", user: str = "u1") -> Job:
        return Job(isolated, db, workspace, name, agent, user)

    return make


@pytest.fixture(autouse=True)
def disk_untouched(workspace: Path) -> Iterator[None]:
    yield
    assert list(workspace.iterdir()) == [], "an intercepted call touched the workspace disk"


def test_open_agent_users_get_their_own_copy_over_the_agent_template(db: Store, job: Any) -> None:
    files = ContextFileStore(db.conn)
    files.put("main", "", "SOUL.md", "You are calm.", 0)
    alice, bob = job("a", user="alice"), job("b", user="bob")
    assert "You are calm." in alice("read_file", path="SOUL.md").for_llm
    wrote = alice("write_file", path="SOUL.md", content="You are cheerful.")
    assert not wrote.is_error and "your copy" in wrote.for_llm
    assert "cheerful" in alice("read_file", path="./SOUL.md").for_llm
    assert "calm" in bob("read_file", path="SOUL.md").for_llm  # bob still has the template
    assert files.get("main", "", "SOUL.md").content == "You are calm."  # type: ignore[union-attr]
    assert files.get("main", "alice", "SOUL.md").content == "You are cheerful."  # type: ignore[union-attr]


def test_predefined_agent_files_are_the_agents_and_only_user_files_are_per_user(
    db: Store, job: Any
) -> None:
    files = ContextFileStore(db.conn)
    files.set_kind("helper", "predefined")
    files.put("helper", "", "IDENTITY.md", "I am Helper.", 0)
    alice = job(agent="helper", user="alice")
    assert "I am Helper." in alice("read_file", path="IDENTITY.md").for_llm
    refused = alice("write_file", path="IDENTITY.md", content="I am someone else.")
    assert refused.is_error and "predefined" in refused.for_llm
    refused = alice("edit_file", path="IDENTITY.md", old_string="Helper", new_string="X")
    assert refused.is_error and "cannot change" in refused.for_llm
    assert files.get("helper", "", "IDENTITY.md").content == "I am Helper."  # type: ignore[union-attr]
    assert not alice("write_file", path="USER.md", content="Alice likes tea.").is_error
    assert files.get("helper", "alice", "USER.md").content == "Alice likes tea."  # type: ignore[union-attr]
    assert files.get("helper", "", "USER.md") is None
    assert alice("read_file", path="USER.md").metadata["version"] > 0


def test_an_empty_bootstrap_deletes_it(db: Store, job: Any) -> None:
    files = ContextFileStore(db.conn)
    alice = job(user="alice")
    assert not alice("write_file", path="BOOTSTRAP.md", content="Say hello first.").is_error
    assert files.get("main", "alice", "BOOTSTRAP.md") is not None
    deleted = alice("write_file", path="BOOTSTRAP.md", content="")
    assert "deleted" in deleted.for_llm
    assert files.get("main", "alice", "BOOTSTRAP.md") is None
    assert alice("read_file", path="BOOTSTRAP.md").is_error


def test_a_write_over_a_newer_version_fails_instead_of_being_lost(db: Store, job: Any) -> None:
    first, second = job("first", user="alice"), job("second", user="alice")
    assert not first("write_file", path="USER.md", content="v1").is_error
    first("read_file", path="USER.md")
    second("read_file", path="USER.md")
    assert not second("write_file", path="USER.md", content="second's").is_error
    lost = first("write_file", path="USER.md", content="first's")
    assert lost.is_error and "changed since you read it" in lost.for_llm
    assert ContextFileStore(db.conn).get("main", "alice", "USER.md").content == "second's"  # type: ignore[union-attr]
    blind = job("third", user="alice")("write_file", path="USER.md", content="never read")
    assert blind.is_error and "read it first" in blind.for_llm
    # memory documents are version-checked the same way
    first("write_file", path="memory/a.md", content="one")
    second("read_file", path="memory/a.md")
    first("write_file", path="memory/a.md", content="two")
    stale = second("edit_file", path="memory/a.md", old_string="one", new_string="1")
    assert stale.is_error and "not found" in stale.for_llm
    overwrite = second("write_file", path="memory/a.md", content="three")
    assert overwrite.is_error and "changed since you read it" in overwrite.for_llm


def test_memory_reads_the_users_copy_then_the_global_one(db: Store, job: Any) -> None:
    memory = MemoryStore(db.conn)
    memory.put("main", "", "MEMORY.md", "global facts\n", 0, index=False)
    memory.put("main", "", "memory/shared.md", "shared note\n", 0, index=False)
    alice, bob = job("a", user="alice"), job("b", user="bob")
    assert "global facts" in alice("read_file", path="MEMORY.md").for_llm
    assert not alice("write_file", path="MEMORY.md", content="alice's facts\n").is_error
    assert not alice("write_file", path="memory/notes/today.md", content="met Bob\n").is_error
    assert "alice's facts" in alice("read_file", path="MEMORY.md").for_llm
    assert "global facts" in bob("read_file", path="MEMORY.md").for_llm
    assert bob("read_file", path="memory/notes/today.md").is_error
    appended = alice("write_file", path="memory/notes/today.md", content="lunch\n", append=True)
    assert not appended.is_error
    assert memory.exact("main", "alice", "memory/notes/today.md").content == "met Bob\nlunch\n"  # type: ignore[union-attr]
    edited = alice("edit_file", path="memory/notes/today.md", old_string="lunch", new_string="tea")
    assert not edited.is_error
    assert alice("list_files", path="memory").for_llm.split() == ["notes/", "shared.md"]
    assert alice("list_files", path="memory/notes").for_llm.split() == ["today.md"]
    assert set(alice("list_files", path=".").for_llm.split()) == {"MEMORY.md", "memory/"}
    assert "[empty directory]" in bob("list_files", path="memory/notes").for_llm
    got = alice("memory_get", path="memory/notes/today.md", **{"from": 2, "lines": 1})
    assert got.for_llm == "tea" and got.metadata["scope"] == "user"
    # a markdown write queues its indexing in the same transaction; other files do not
    outbox = db.conn.execute("SELECT count(*) AS n FROM memory_outbox").fetchone()
    assert outbox is not None and outbox["n"] == 2
    alice("write_file", path="memory/data.json", content="{}")
    outbox = db.conn.execute("SELECT count(*) AS n FROM memory_outbox").fetchone()
    assert outbox is not None and outbox["n"] == 2


def test_a_database_error_refuses_the_write_and_never_falls_back_to_disk(
    isolated: Isolated, workspace: Path, job: Any
) -> None:
    broken = Store(isolated.database_url)
    broken.conn.close()  # the database went away under the worker, and stays away:
    broken.url = "postgresql://postgres@127.0.0.1:1/gone?connect_timeout=2"  # no reopening
    alice = Job(isolated, broken, workspace, "j", "main", "alice")
    for path in ("SOUL.md", "memory/notes.md", "MEMORY.md"):
        refused = alice("write_file", path=path, content="x")
        assert refused.is_error and "nothing was changed" in refused.for_llm, refused.for_llm
        assert alice("read_file", path=path).is_error
    assert alice("list_files", path="memory").is_error


def test_paths_that_only_look_routed_go_to_disk(workspace: Path, job: Any) -> None:
    alice = job(user="alice")
    (workspace / "docs").mkdir()
    try:
        assert not alice("write_file", path="docs/SOUL.md", content="on disk").is_error
        assert (workspace / "docs" / "SOUL.md").read_text() == "on disk"
    finally:
        (workspace / "docs" / "SOUL.md").unlink()
        (workspace / "docs").rmdir()
    # memory/../SOUL.md is SOUL.md: routed, not a way around the router
    assert not alice("write_file", path="memory/../SOUL.md", content="routed").is_error
    assert not (workspace / "SOUL.md").exists()


def test_the_root_listing_shows_the_disk_the_context_files_and_the_memory_at_once(
    db: Store, job: Any, workspace: Path
) -> None:
    (workspace / "notes.txt").write_text("on disk\n")
    ContextFileStore(db.conn).put("main", "", "SOUL.md", "calm\n", 0)
    ContextFileStore(db.conn).put("main", "alice", "USER.md", "alice\n", 0)
    ContextFileStore(db.conn).put("other", "", "TOOLS.md", "another agent's\n", 0)
    MemoryStore(db.conn).put("main", "alice", "memory/a.md", "x\n", 0, index=False)
    MemoryStore(db.conn).put("main", "bob", "MEMORY.md", "bob's\n", 0, index=False)
    alice, bob = job("a", user="alice"), job("b", user="bob")
    assert alice("list_files").for_llm.split() == ["SOUL.md", "USER.md", "memory/", "notes.txt"]
    assert bob("list_files").for_llm.split() == ["MEMORY.md", "SOUL.md", "notes.txt"]
    (workspace / "notes.txt").unlink()  # the test's own file: the listing only read it


def test_the_memorys_listings_read_only_what_they_show(
    isolated: Isolated, db: Store, workspace: Path
) -> None:
    """At the root, three rows at most however many documents the memory holds; below a
    directory, only the documents under it (a sibling whose name starts the same is not)."""
    memory = MemoryStore(db.conn)
    for n in range(40):
        memory.put("main", "alice", f"memory/day{n}.md", "x\n", 0, index=False)
    memory.put("main", "", "MEMORY.md", "global\n", 0, index=False)
    memory.put("main", "alice", "memory/notes/a.md", "x\n", 0, index=False)
    memory.put("main", "alice", "memory/notes2/b.md", "x\n", 0, index=False)
    ctx = ToolContext(
        context=CallContext(workspace=str(workspace), agent_id="main", user_id="alice"),
        settings=isolated.settings,
        job_id="j",
        store=lambda: db,
    )
    read = Memory()
    assert listed([read.listing(".", ctx)], ".", ctx) == ["MEMORY.md", "memory/"]  # type: ignore[list-item]
    under = read.listing("memory/notes", ctx)
    assert under is not None and under.params[-1] == "memory/notes/"
    assert listed([under], "memory/notes", ctx) == ["a.md"]
