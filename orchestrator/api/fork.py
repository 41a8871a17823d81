"""Forks over HTTP: `POST /v1/jobs/{id}/fork` starts a new job in a new session from a
recorded job's turn, in its workspace as it was then (as `Client.fork`). A user forks
only their own jobs, into a workspace under their roots."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.admin.fork import Fork
from orchestrator.api.deps import Caller, Id, Svc
from orchestrator.api.jobs import OwnedJob, running_guard

router = APIRouter(prefix="/v1", tags=["fork"])


class ForkBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    at: int = Field(ge=1, description="the turn (1-based) after which the fork goes on")
    message: str = Field("", description="the fork's next user input")
    workspace: str = Field("", description="where its workspace is made; '': beside the job's")
    model: str = Field("", description="the model it goes on with; '': the job's")
    script: dict[str, Any] | None = Field(None, description="the scripted model's script")


@router.post("/jobs/{job_id}/fork", status_code=201)
def fork(job_id: Id, body: ForkBody, job: OwnedJob, caller: Caller, svc: Svc) -> Fork:
    reserved = uuid.uuid4().hex
    running_guard(svc, caller, reserved)
    return svc.client().fork(
        job_id,
        body.at,
        message=body.message,
        workspace=body.workspace,
        model=body.model,
        script=body.script,
        user=caller.user_id,
        admin=caller.admin,
        new_id=reserved,
    )
