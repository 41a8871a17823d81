"""Artifacts over HTTP: the bytes of a screenshot, PDF or download, to the key of the
user whose job made it (another user's is 404, as for jobs)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from broker.errors import NotFound
from broker.stores.artifacts import ArtifactStore
from orchestrator.api.deps import Caller, Id, Svc

router = APIRouter(prefix="/v1", tags=["artifacts"])


@router.get("/artifacts/{artifact_id}", response_class=Response)
def artifact(artifact_id: Id, caller: Caller, svc: Svc) -> Response:
    store = ArtifactStore(svc.client().store.conn, svc.settings)
    found = store.get(artifact_id)
    if found is None or not caller.may_see(found.user_id):
        raise NotFound(f"no artifact {artifact_id}")
    data = store.read(found)
    headers = {
        "ETag": f'"{found.hash}"',
        "Cache-Control": "private, max-age=3600",
        "X-Content-Type-Options": "nosniff",
        "Content-Disposition": f'inline; filename="{found.id}"',
    }
    return Response(content=data, media_type=found.mime, headers=headers)
