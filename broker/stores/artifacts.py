"""Artifacts: binary tool results stored once by content hash, behind one small store.

The bytes live in PostgreSQL (`bytea`) or in a directory every worker and the API share
(`CLAWQ_ARTIFACT_STORE=files`, `CLAWQ_ARTIFACT_DIR`), named by their sha256; the rows
(type, size, dimensions, owner, expiry) are always in PostgreSQL. A tool result carries
the artifact's id; the HTTP API serves it to its owner at /v1/artifacts/{id}."""

from __future__ import annotations

import hashlib
import os
import secrets
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from pydantic import BaseModel

from broker.config.settings import Settings
from broker.errors import Gone, RunError

COLUMNS = (
    "id, hash, mime, size, width, height, duration_s, name, user_id, session_id, job_id,"
    " created_at, expires_at"
)


class ArtifactGone(Gone):
    """An artifact whose bytes are no more (a file removed under it)."""


class ArtifactError(RunError):
    """The bytes of an artifact are missing or cannot be stored."""


class Artifact(BaseModel):
    id: str
    hash: str
    mime: str
    size: int
    width: int | None = None
    height: int | None = None
    duration_s: float | None = None  # audio and video
    name: str = ""
    user_id: str = ""
    session_id: str = ""
    job_id: str = ""
    created_at: datetime
    expires_at: datetime

    def describe(self) -> str:
        """What the model is told about it."""
        shape = f", {self.width}x{self.height}" if self.width and self.height else ""
        length = f", {self.duration_s:.1f} s" if self.duration_s else ""
        return f"artifact {self.id} ({self.mime}, {self.size} bytes{shape}{length})"


class ArtifactStore:
    def __init__(self, conn: psycopg.Connection[Any], settings: Settings) -> None:
        self.conn = conn
        self.settings = settings
        self.in_files = settings.artifact_store == "files"
        self.root = Path(settings.artifact_dir)

    def _path(self, digest: str) -> Path:
        return self.root / digest[:2] / digest

    def put(
        self,
        data: bytes,
        mime: str,
        *,
        user_id: str = "",
        session_id: str = "",
        job_id: str = "",
        name: str = "",
        width: int | None = None,
        height: int | None = None,
        duration_s: float | None = None,
        retention_s: int | None = None,
    ) -> Artifact:
        """Store `data` once by its hash (`retention_s`: kept this long instead of
        `artifact_retention_s`)."""
        if len(data) > self.settings.artifact_max_bytes:
            raise ArtifactError(
                f"an artifact of {len(data)} bytes is over the {self.settings.artifact_max_bytes}"
                "-byte cap"
            )
        digest = hashlib.sha256(data).hexdigest()
        if self.in_files:
            self._write_file(digest, data)
        # one statement, no transaction block: threads of a worker may share the connection
        row = self.conn.execute(
            "WITH blob AS (INSERT INTO artifact_blobs (hash, size, data) VALUES (%s, %s, %s)"
            " ON CONFLICT (hash) DO NOTHING)"
            " INSERT INTO artifacts (id, hash, mime, size, width, height, duration_s, name,"
            " user_id, session_id, job_id, expires_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s,"
            " %s, %s, %s, now() + make_interval(secs => %s)) RETURNING " + COLUMNS,
            (
                digest,
                len(data),
                None if self.in_files else data,
                "art_" + secrets.token_hex(12),
                digest,
                mime,
                len(data),
                width,
                height,
                duration_s,
                name,
                user_id,
                session_id,
                job_id,
                retention_s or self.settings.artifact_retention_s,
            ),
        ).fetchone()
        return Artifact.model_validate(row)

    def _write_file(self, digest: str, data: bytes) -> None:
        path = self._path(digest)
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)  # whole or absent: readers never see a partial file
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, artifact_id: str) -> Artifact | None:
        row = self.conn.execute(
            f"SELECT {COLUMNS} FROM artifacts WHERE id = %s AND expires_at > now()",
            (artifact_id,),
        ).fetchone()
        return Artifact.model_validate(row) if row else None

    def read(self, artifact: Artifact) -> bytes:
        row = self.conn.execute(
            "SELECT data FROM artifact_blobs WHERE hash = %s", (artifact.hash,)
        ).fetchone()
        if row is not None and row["data"] is not None:
            return bytes(row["data"])
        try:
            return self._path(artifact.hash).read_bytes()
        except OSError as exc:
            raise ArtifactGone(f"the bytes of {artifact.id} are missing: {exc}") from None

    def purge(self) -> int:
        """Remove expired artifacts, and blobs no artifact uses any more."""
        with self.conn.transaction():
            gone = self.conn.execute("DELETE FROM artifacts WHERE expires_at <= now()").rowcount
            blobs = self.conn.execute(
                "DELETE FROM artifact_blobs b WHERE NOT EXISTS"
                " (SELECT 1 FROM artifacts a WHERE a.hash = b.hash) RETURNING hash, data IS NULL"
                " AS in_file"
            ).fetchall()
        for blob in blobs:
            if blob["in_file"]:
                self._path(blob["hash"]).unlink(missing_ok=True)
        return gone
