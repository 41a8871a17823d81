"""Replays over HTTP: run a recorded job again (`POST /v1/jobs/{id}/replay`, as
`Client.replay`), and read how a replay differs from its original
(`GET /v1/jobs/{id}/diff`). A user replays only their own jobs."""

from __future__ import annotations

import uuid

from fastapi import APIRouter
from pydantic import ConfigDict

from orchestrator.admin.replay import ReplayDiff, ReplayOptions
from orchestrator.api.deps import Caller, Id, Svc
from orchestrator.api.jobs import OwnedJob, Submitted, running_guard

router = APIRouter(prefix="/v1", tags=["replay"])


class ReplayBody(ReplayOptions):
    model_config = ConfigDict(extra="forbid")


@router.post("/jobs/{job_id}/replay", status_code=201)
def replay(job_id: Id, body: ReplayBody, job: OwnedJob, caller: Caller, svc: Svc) -> Submitted:
    """Queue a replay of the job: its calls answered from the job's ledger."""
    reserved = uuid.uuid4().hex
    running_guard(svc, caller, reserved)
    replayed = svc.client().replay(
        job_id,
        user=caller.user_id,
        admin=caller.admin,
        new_id=reserved,
        **body.model_dump(exclude_unset=True),
    )
    return Submitted(job_id=replayed.id, session_id=replayed.id)


@router.get("/jobs/{job_id}/diff")
def replay_diff(job_id: Id, job: OwnedJob, svc: Svc) -> ReplayDiff:
    """How a replay differs from its original (404 for a job that is no replay)."""
    return svc.client().replay_diff(job_id)
