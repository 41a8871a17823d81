"""Memory and context files through the whole stack: real orchestrators, fs and memory
workers (the local embedder), PostgreSQL and Redis.

- a job writes memory/notes.md; a later job of another session of the same agent and user
  finds it with memory_search, a job of another user does not;
- the index task runs on the memory queue through the outbox, and a lost one is sent
  again by the sweeper;
- the system prompt is built from the agent's context files, and a change is seen by the
  next job whichever orchestrator runs it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.pg.store import Store
from broker.stores.context_files import ContextFileStore
from broker.stores.memory import MemoryStore
from tests.integration.conftest import Cluster, call, script, start_cluster, wait_until
from tests.orchestrator.conftest import ModelServer, openai_chunk, sse


@pytest.fixture(scope="module")
def server() -> Iterator[ModelServer]:
    with ModelServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def cluster(server: ModelServer) -> Iterator[Cluster]:
    yield from start_cluster(
        groups=("fs", "memory"),
        orchestrators=2,
        memory_embedder="local",
        memory_outbox_sweep_s=0.5,
        openai_base_url=f"{server.url}/v1",
        openai_api_key="sk-test",
    )


@pytest.fixture
def store(cluster: Cluster) -> Iterator[Store]:
    s = Store(cluster.iso.database_url)
    yield s
    s.close()


def indexed(store: Store, path: str) -> bool:
    row = store.conn.execute(
        "SELECT indexed_version = version AS done FROM memory_documents WHERE path = %s",
        (path,),
    ).fetchone()
    return bool(row and row["done"])


def search_job(cluster: Cluster, workspace: Path, user: str, query: str) -> Any:
    job = cluster.client.submit(
        "what do I know?",
        workspace=str(workspace),
        user=user,
        script=script({"tool_calls": [call("s", "memory_search", query=query)]}, {"text": "ok"}),
    )
    result = job.wait(timeout=60)
    assert result.status == "completed", result
    (found,) = result.tool_calls
    assert not found.is_error, found.output
    assert found.queue == "memory"
    return found


def test_a_note_is_found_by_a_later_session_of_its_user_only(
    cluster: Cluster, store: Store, workspace: Path
) -> None:
    note = "# Car\nMy vehicle is a 2019 Subaru Outback, dark green, bought used in Denver.\n"
    writer = cluster.client.submit(
        "remember my car",
        workspace=str(workspace),
        user="alice",
        script=script(
            {"tool_calls": [call("w", "write_file", path="memory/notes.md", content=note)]},
            {"text": "noted"},
        ),
    )
    result = writer.wait(timeout=60)
    assert result.status == "completed" and not result.tool_calls[0].is_error
    assert not (workspace / "memory").exists()  # routed to the store, not the disk
    wait_until(lambda: indexed(store, "memory/notes.md"), 60, "the note indexed")

    found = search_job(cluster, workspace, "alice", "what car does the user drive")
    first = found.output.split("\n\n")[0]
    assert first.startswith("1. memory/notes.md:1-2") and "Subaru" in first
    assert "your memory" in first and "vector " in first  # the user's, found by both channels
    other = search_job(cluster, workspace, "bob", "what car does the user drive")
    assert "Subaru" not in other.output and "memory/notes.md" not in other.output


def test_a_lost_index_task_is_sent_again_by_the_sweeper(cluster: Cluster, store: Store) -> None:
    memory = MemoryStore(store.conn)
    doc = memory.put(
        "main", "carol", "memory/lost.md", "The boat is moored at pier 9.", 0, index=True
    )
    store.conn.execute("UPDATE memory_outbox SET next_at = now() WHERE document_id = %s", (doc.id,))
    # no task was sent for it: only the sweeper can index it
    wait_until(lambda: indexed(store, "memory/lost.md"), 30, "the sweeper's resend")
    left = store.conn.execute(
        "SELECT count(*) AS n FROM memory_outbox WHERE document_id = %s", (doc.id,)
    ).fetchone()
    assert left is not None and left["n"] == 0


def openai_text(text: str) -> str:
    return sse(
        (None, openai_chunk({"role": "assistant", "content": text})),
        (None, openai_chunk({}, "stop")),
        done=True,
    )


def test_the_system_prompt_is_built_from_context_files_and_never_stale(
    cluster: Cluster, server: ModelServer, store: Store, workspace: Path
) -> None:
    files = ContextFileStore(store.conn)
    files.put("poet", "", "SOUL.md", "You answer in rhymes.", 0)
    files.put("poet", "", "IDENTITY.md", "Your name is Quill.", 0)
    files.put("poet", "dana", "USER.md", "Dana prefers haiku.", 0)
    systems = []
    served: dict[str, set[str]] = {}  # soul → the orchestrators that ran a job with it
    for soul in ("You answer in rhymes.", "You answer in limericks."):
        if soul != "You answer in rhymes.":
            files.put("poet", "", "SOUL.md", soul, files.version("poet", "", "SOUL.md"))
        served[soul] = set()
        for _ in range(30):  # until each of the two orchestrators has run one with this soul
            if len(served[soul]) == 2:
                break
            start = len(server.requests)
            server.reply_sse(openai_text("ok"))
            job = cluster.client.submit(
                "hi", model="openai:gpt-test", agent="poet", user="dana", workspace=str(workspace)
            )
            assert job.wait(timeout=60).status == "completed"
            row = store.conn.execute("SELECT orchestrator FROM jobs WHERE id = %s", (job.id,))
            served[soul].add(row.fetchone()["orchestrator"])
            (request,) = server.requests[start:]
            first = request.body["messages"][0]
            assert first["role"] == "system"
            systems.append((soul, first["content"]))
    # both orchestrators built a prompt from the old soul, and then each from the new one
    assert served["You answer in rhymes."] == served["You answer in limericks."]
    assert len(served["You answer in limericks."]) == 2
    for soul, system in systems:
        assert (
            soul in system and "Your name is Quill." in system and "Dana prefers haiku." in system
        )
        assert (
            system.index("## SOUL.md") < system.index("## IDENTITY.md") < system.index("## USER.md")
        )
    assert not any("rhymes" in system for soul, system in systems if "limericks" in soul)
