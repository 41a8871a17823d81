"""Jobs and sessions over HTTP: submit, read, follow (Server-Sent Events, resumable with
`Last-Event-ID`), approve, cancel, steer, the subagent tree; a session's jobs and
transcript. A user sees only their own: another's job is 404, never 403."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import BaseModel, ConfigDict, Field

from broker import keys
from broker.config.policy import PermissionMode
from broker.errors import Forbidden, NotFound, TooManyJobs
from broker.protocol import FINAL_STATUSES, JobResult, Limits, Subagent
from orchestrator.api.deps import Caller, Id, OwnedSession, Services, Svc

router = APIRouter(prefix="/v1", tags=["jobs"])
STREAM_ID = r"^[0-9]{1,20}(-[0-9]{1,20})?$"  # a Redis stream id: where to resume


class SubmitJob(BaseModel):
    """The fields of `Client.submit`; the user is the key's."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1)
    workspace: str = Field(
        "",
        description="on the workers, under the user's roots; empty or relative: under "
        "CLAWQ_WORKSPACE_ROOT/<user>",
    )
    model: str = "scripted"
    script: dict[str, Any] | None = None
    allow: list[str] = Field(default_factory=list)
    ask: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)
    permission_mode: PermissionMode = "default"
    agent: str = "main"
    max_iterations: int | None = Field(None, ge=1)
    system: str = ""
    channel: str = Field("", description="the message channel the prompt came from")
    chat_id: str = Field("", description="its chat (a chat id, a Slack channel, an address)")
    budget: Limits | None = Field(None, description="turns, tokens, cost_usd of the whole tree")


class Submitted(BaseModel):
    job_id: str
    session_id: str  # its canvas: GET /v1/sessions/{session_id}/canvas-link
    status: str = "queued"


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    decision: Literal["allow-once", "allow-always", "deny"]


class Steer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message: str = Field(min_length=1)


class SessionMessage(BaseModel):
    seq: int
    role: str
    job_id: str
    content: dict[str, Any]


class SessionJob(BaseModel):
    id: str
    status: str
    iterations: int
    prompt: str


class SessionView(BaseModel):
    id: str
    agent_id: str
    user_id: str
    jobs: list[SessionJob]
    messages: list[SessionMessage]


def owned_job(job_id: Id, caller: Caller, svc: Svc) -> dict[str, Any]:
    """The job row if this caller may see it; 404 otherwise (no probing). A dependency,
    so it is decided before a response (an event stream) starts."""
    row = svc.client().store.job(job_id)
    if row is None or not caller.may_see(row["spec"].get("user_id", "")):
        raise NotFound(f"no job {job_id}")
    return row


OwnedJob = Annotated[dict[str, Any], Depends(owned_job)]


def running_guard(svc: Services, caller: Any, job_id: str) -> None:
    """At most `CLAWQ_API_MAX_RUNNING_JOBS` unfinished jobs per key, counted in Redis
    (finished ones are dropped from the count as it is read)."""
    client = svc.client()
    key = f"{keys.PREFIX}:api:running:{caller.key_id}"
    members = [m.decode() for m in client.redis.zrange(key, 0, -1)]  # type: ignore[union-attr]
    done = [m for m in members if client.store.job_status(m) in FINAL_STATUSES | {None}]
    if done:
        client.redis.zrem(key, *done)
    if len(members) - len(done) >= svc.settings.api_max_running_jobs:
        raise TooManyJobs(
            f"{len(members) - len(done)} jobs of this key are running (the limit): wait for one"
        )
    client.redis.zadd(key, {job_id: time.time()})
    client.redis.expire(key, 7 * 86400)


@router.post("/jobs", status_code=201)
def submit(body: SubmitJob, caller: Caller, svc: Svc) -> Submitted:
    """Queue an agent job, as `Client.submit` does."""
    import uuid

    if not caller.may_run(body.agent):
        raise NotFound(f"no agent {body.agent}")
    if (body.channel or body.chat_id) and not caller.admin:
        raise Forbidden(
            "channel origins come from verified inbound channels or an admin's key", "channel"
        )
    workspace = body.workspace
    if caller.admin and not os.path.isabs(workspace):
        workspace = os.path.join(svc.settings.workspace_root, caller.user_id, workspace)
    job_id = uuid.uuid4().hex
    running_guard(svc, caller, job_id)
    job = svc.client().submit(
        body.prompt,
        admin=caller.admin,
        workspace=workspace,
        model=body.model,
        script=body.script,
        allow=body.allow,
        ask=body.ask,
        deny=body.deny,
        permission_mode=body.permission_mode,
        agent=body.agent,
        user=caller.user_id,
        max_iterations=body.max_iterations,
        system=body.system,
        job_id=job_id,
        channel=body.channel,
        chat_id=body.chat_id,
        budget=body.budget.model_dump() if body.budget else None,
    )
    row = svc.client().store.job(job.id) or {}
    return Submitted(job_id=job.id, session_id=row.get("session_id", job.id))


@router.get("/jobs/{job_id}")
def get_job(job_id: Id, job: OwnedJob, svc: Svc) -> JobResult:
    return svc.client().job(job_id).result()


@router.get("/jobs/{job_id}/events", response_class=EventSourceResponse)
async def events(
    job_id: Id,
    job: OwnedJob,
    svc: Svc,
    last_event_id: Annotated[str | None, Header(pattern=STREAM_ID)] = None,
    after: Annotated[str | None, Query(pattern=STREAM_ID)] = None,
) -> AsyncIterator[ServerSentEvent]:
    """The job's events as SSE, from the start or after `Last-Event-ID` (or `?after=`);
    the stream ends after `job_finished`."""
    watching = svc.hub.watch(job_id, last_event_id or after, svc.settings.api_sse_keepalive_s)
    async for event in watching:
        if event is not None:
            yield ServerSentEvent(raw_data=event.json, event=event.type, id=event.id)
            continue
        async with svc.pool.connection() as conn:  # quiet: has it ended without a word?
            cur = await conn.execute("SELECT status FROM jobs WHERE id = %s", (job_id,))
            row = await cur.fetchone()
        if row is None or row[0] in FINAL_STATUSES:
            return
        yield ServerSentEvent(comment="keep-alive")


@router.post("/jobs/{job_id}/approvals/{request_id}", status_code=204)
def approve(
    job_id: Id, request_id: Id, body: Answer, job: OwnedJob, caller: Caller, svc: Svc
) -> None:
    """Answer an approval: the job's user or an admin."""
    svc.client().job(job_id).approve(
        request_id, body.decision, by=f"api:{caller.user_id}", admin=caller.admin
    )


@router.post("/jobs/{job_id}/cancel", status_code=204)
def cancel(job_id: Id, job: OwnedJob, svc: Svc) -> None:
    svc.client().job(job_id).cancel()


@router.post("/jobs/{job_id}/steer", status_code=204)
def steer(job_id: Id, body: Steer, job: OwnedJob, svc: Svc) -> None:
    svc.client().job(job_id).steer(body.message)


@router.get("/jobs/{job_id}/subagents")
def subagents(job_id: Id, job: OwnedJob, svc: Svc) -> list[Subagent]:
    return svc.client().job(job_id).subagents()


@router.get("/sessions/{session_id}")
def session(session_id: OwnedSession, svc: Svc, last: int = 100) -> SessionView:
    store = svc.client().store
    row = store.conn.execute(
        "SELECT id, agent_id, user_id FROM sessions WHERE id = %s", (session_id,)
    ).fetchone()
    assert row is not None  # owned_session found it
    jobs = store.conn.execute(
        "SELECT id, status, iterations, spec->>'prompt' AS prompt FROM jobs"
        " WHERE session_id = %s ORDER BY created_at",
        (session_id,),
    ).fetchall()
    return SessionView(
        id=row["id"],
        agent_id=row["agent_id"],
        user_id=row["user_id"],
        jobs=[SessionJob.model_validate(j) for j in jobs],
        messages=[
            SessionMessage.model_validate(m) for m in store.transcript(session_id, min(last, 1000))
        ],
    )
