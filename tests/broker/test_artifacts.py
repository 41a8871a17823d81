"""Artifacts on real PostgreSQL: stored once by content hash in the database or in a
shared directory, read back whole, hidden once expired, and purged with their bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.pg.store import Store
from broker.stores.artifacts import ArtifactError, ArtifactStore
from tests.conftest import Isolated


@pytest.mark.parametrize("backend", ["postgres", "files"])
def test_stored_once_read_back_expired_and_purged(
    isolated: Isolated, tmp_path: Path, backend: str
) -> None:
    settings = isolated.settings.model_copy(
        update={"artifact_store": backend, "artifact_dir": str(tmp_path / "artifacts")}
    )
    store = Store(isolated.database_url)
    try:
        artifacts = ArtifactStore(store.conn, settings)
        data = b"\xff\xd8" + b"jpeg bytes" * 100
        first = artifacts.put(data, "image/jpeg", user_id="ann", width=10, height=20)
        second = artifacts.put(data, "image/jpeg", user_id="bob")
        assert first.id != second.id and first.hash == second.hash
        blobs = store.conn.execute("SELECT count(*) AS n FROM artifact_blobs").fetchone()
        assert blobs is not None and blobs["n"] == 1  # the bytes once
        files = list((tmp_path / "artifacts").rglob("*")) if backend == "files" else []
        assert len([f for f in files if f.is_file()]) == (1 if backend == "files" else 0)
        got = artifacts.get(first.id)
        assert got is not None and artifacts.read(got) == data
        assert "image/jpeg" in got.describe() and "10x20" in got.describe()

        store.conn.execute("UPDATE artifacts SET expires_at = now() - interval '1 second'")
        assert artifacts.get(first.id) is None  # expired: not served any more
        assert artifacts.purge() == 2
        blobs = store.conn.execute("SELECT count(*) AS n FROM artifact_blobs").fetchone()
        assert blobs is not None and blobs["n"] == 0
        assert not [f for f in (tmp_path / "artifacts").rglob("*") if f.is_file()]
        with pytest.raises(ArtifactError):
            artifacts.put(b"x" * (settings.artifact_max_bytes + 1), "application/octet-stream")
    finally:
        store.close()
