"""`clawq context …` and `clawq memory …` on a real PostgreSQL: an agent's kind and files,
memory status with a recorded failure, search as a job would, and reindex queueing."""

from __future__ import annotations

import json
from pathlib import Path

import redis
from click.testing import CliRunner

from broker import keys
from broker.pg.store import Store
from broker.stores.memory import MemoryStore
from orchestrator.cli import main as cli
from tests.conftest import Isolated
from workers.tools.memory.index import index_document


def test_context_and_memory_commands(isolated: Isolated, tmp_path: Path) -> None:
    runner = CliRunner()
    env = {**isolated.env(), "CLAWQ_MEMORY_EMBEDDER": "none"}

    def clawq(*args: str, stdin: str | None = None) -> str:
        done = runner.invoke(cli.main, list(args), env=env, input=stdin)
        assert done.exit_code == 0, done.output
        return done.stdout

    assert clawq("context", "kind", "helper").strip() == "open"
    assert clawq("context", "kind", "helper", "predefined").strip() == "predefined"
    soul = tmp_path / "soul.md"
    soul.write_text("You are Helper.")
    tokens = redis.Redis.from_url(isolated.redis_url)
    tokens.set(keys.routed_files("helper"), "cached under this")
    clawq("context", "set", "helper", "SOUL.md", str(soul))
    # workers' cached listings of the agent's files are answered no more
    assert tokens.get(keys.routed_files("helper")) not in (None, b"cached under this")
    clawq("context", "set", "helper", "USER.md", "-", "--user", "ann", stdin="Ann likes tea.")
    assert clawq("context", "show", "helper", "SOUL.md", "--user", "ann") == "You are Helper."
    listed = json.loads(clawq("context", "list", "helper", "--json"))
    assert {(f["name"], f["user_id"]) for f in listed} == {("SOUL.md", ""), ("USER.md", "ann")}
    bad = runner.invoke(cli.main, ["context", "set", "helper", "NOTES.md", str(soul)], env=env)
    assert bad.exit_code == 2 and "NOTES.md" in bad.output

    store = Store(isolated.database_url)
    try:
        memory = MemoryStore(store.conn)
        doc = memory.put(
            "main", "", "memory/plants.md", "Water the fern on Sundays.", 0, index=True
        )
        index_document(
            memory, isolated.settings.model_copy(update={"memory_embedder": "none"}), doc.id
        )
        memory.put("main", "", "memory/broken.md", "x", 0, index=True)
        broken = memory.get("main", "", "memory/broken.md")
        assert broken is not None
        memory.index_failed(broken.id, "embedding with openai failed: 503", 30, 3600)
    finally:
        store.close()
    status = json.loads(clawq("memory", "status", "--json"))
    assert (status["documents"], status["indexed"], status["pending"]) == (2, 1, 1)
    assert status["embedder"] == "none" and status["errors"][0]["path"] == "memory/broken.md"
    assert "failures:" in clawq("memory", "status")
    hits = json.loads(clawq("memory", "search", "fern watering", "--json"))
    assert hits[0]["path"] == "memory/plants.md" and hits[0]["scope"] == "global"

    done = runner.invoke(cli.main, ["memory", "reindex"], env=env)
    assert done.exit_code == 0 and "queued 2 documents" in done.stderr
    with redis.Redis.from_url(isolated.redis_url) as r:
        assert r.llen("memory") == 2  # two index tasks on the memory queue
