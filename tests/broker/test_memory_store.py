"""Two writers of one memory document at once, on real PostgreSQL, each on a connection of
its own (two workers): a write that read the same version as another loses with a
version conflict instead of overwriting it, and appends never lose one another."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from broker.pg.store import Store
from broker.stores.memory import MemoryStore, VersionConflict
from tests.conftest import Isolated

ROUNDS = 25


def together(isolated: Isolated, *writers: Callable[[MemoryStore], Any]) -> list[Any]:
    """Run each writer on its own connection, released at the same instant; returns what
    each returned or raised."""
    stores = [Store(isolated.database_url) for _ in writers]
    start = threading.Barrier(len(writers))
    out: list[Any] = [None] * len(writers)

    def run(n: int) -> None:
        start.wait()
        try:
            out[n] = writers[n](MemoryStore(stores[n].conn))
        except Exception as exc:  # the outcome under test
            out[n] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(writers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for store in stores:
        store.close()
    return out


def test_two_writers_of_one_version_one_wins_and_the_other_is_told(isolated: Isolated) -> None:
    setup = Store(isolated.database_url)
    memory = MemoryStore(setup.conn)
    try:
        doc = memory.put("main", "ann", "notes.md", "v0", 0, index=False)
        for n in range(ROUNDS):
            read = doc.version  # both writers read this version, then write on it
            outcomes = together(
                isolated,
                lambda m, n=n, v=read: m.put("main", "ann", "notes.md", f"a{n}", v, index=False),
                lambda m, n=n, v=read: m.put("main", "ann", "notes.md", f"b{n}", v, index=False),
            )
            won = [o for o in outcomes if not isinstance(o, Exception)]
            lost = [o for o in outcomes if isinstance(o, Exception)]
            assert len(won) == 1 and len(lost) == 1, (n, outcomes)
            assert isinstance(lost[0], VersionConflict) and lost[0].current == won[0].version
            current = memory.exact("main", "ann", "notes.md")
            assert current is not None and current == won[0]  # the loser changed nothing
            doc = current
    finally:
        setup.close()


def test_concurrent_appends_keep_every_line(isolated: Isolated) -> None:
    def appender(name: str) -> Callable[[MemoryStore], None]:
        def write(memory: MemoryStore) -> None:
            for n in range(ROUNDS):
                memory.append("main", "ann", "log.md", f"{name}{n}\n", index=True)

        return write

    assert together(isolated, appender("a"), appender("b")) == [None, None]
    setup = Store(isolated.database_url)
    try:
        doc = MemoryStore(setup.conn).exact("main", "ann", "log.md")
        assert doc is not None
        lines = doc.content.splitlines()
        assert sorted(lines) == sorted(f"{w}{n}" for w in "ab" for n in range(ROUNDS))
        queued = setup.conn.execute("SELECT version FROM memory_outbox").fetchall()
        assert [r["version"] for r in queued] == [doc.version]  # indexed as last written
    finally:
        setup.close()
