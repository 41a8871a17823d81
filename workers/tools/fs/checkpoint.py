"""File checkpoints: write_file and edit_file keep the version of the file they are about
to change (its bytes in the artifact store, stored once by content hash, kept for
`checkpoint_retention_s`), and say so in their result's metadata, which the ledger keeps
with the call: `{"checkpoint": {"path": "<relative>", "prior": "<artifact id>" | null}}`
(null: the file did not exist). A fork reads them back to restore a workspace as it was
after a turn (orchestrator/admin/fork.py). `exec` changes are not tracked."""

from __future__ import annotations

import os
from typing import Any, BinaryIO

from broker.stores.artifacts import ArtifactError, ArtifactStore
from workers.paths import Workspace
from workers.tool import ToolContext


def keep_prior(ws: Workspace, fh: BinaryIO, existed: bool, ctx: ToolContext) -> dict[str, Any]:
    """The checkpoint of the file open as `fh` before this call changes it ({} when
    checkpoints are off or there is no store here; no prior version when it did not
    exist). A file too large, or one the store refused, is changed all the same, and the
    checkpoint says why it holds no prior version."""
    settings = ctx.settings
    if not settings.checkpoints or ctx.store is None:
        return {}
    real = os.readlink(f"/proc/self/fd/{fh.fileno()}")  # as opened: no second resolution
    point: dict[str, Any] = {"path": ws.relative(real), "prior": None}
    if not existed:
        return {"checkpoint": point}
    limit = settings.checkpoint_max_bytes
    fh.seek(0)
    data = fh.read(limit + 1)
    if len(data) > limit:
        return {"checkpoint": point | {"missing": f"larger than {limit} bytes"}}
    try:
        kept = ArtifactStore(ctx.store().conn, settings).put(
            data,
            "application/octet-stream",
            user_id=ctx.context.user_id,
            session_id=ctx.session_id,
            job_id=ctx.job_id,
            name=point["path"],
            retention_s=settings.checkpoint_retention_s,
        )
    except ArtifactError as exc:
        return {"checkpoint": point | {"missing": str(exc)}}
    return {"checkpoint": point | {"prior": kept.id, "hash": kept.hash}}
