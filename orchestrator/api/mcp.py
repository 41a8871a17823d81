"""MCP over HTTP, as `clawq mcp`: servers, the catalog, grants and access requests. Admin
keys only, but for asking access (open to users, for themselves). The routes call
`orchestrator.admin.mcp`, the one implementation, and raise what it raises."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from broker.config.mcp import Grant, McpServer
from broker.errors import Forbidden
from broker.stores.mcp import AccessRequest, McpToolRow, ServerState
from orchestrator.api.deps import Admin, Caller, Id, Svc

router = APIRouter(prefix="/v1", tags=["mcp"])


class ServerView(BaseModel):
    name: str
    transport: str
    target: str
    enabled: bool
    state: str = ""  # connected, retrying, failed; '': no mcp worker has tried it yet
    last_error: str = ""


def _server(s: McpServer, state: ServerState | None) -> ServerView:
    target = " ".join([s.command, *s.args]) if s.transport == "stdio" else s.url
    return ServerView(
        name=s.name,
        transport=s.transport,
        target=target,
        enabled=s.enabled,
        state=state.state if state else "",
        last_error=state.last_error if state else "",
    )


class ForSubject(BaseModel):
    """A server's tools for an agent or a user (one of them)."""

    model_config = ConfigDict(extra="forbid")
    server: str
    agent: str | None = None
    user: str | None = None
    allow: list[str] = Field(default_factory=list)


class GrantBody(ForSubject):
    deny: list[str] = Field(default_factory=list)


class RequestBody(ForSubject):
    reason: str = ""


class Review(BaseModel):
    model_config = ConfigDict(extra="forbid")
    decision: Literal["approve", "reject"]


@router.get("/mcp/servers")
def mcp_servers(caller: Admin, svc: Svc) -> list[ServerView]:
    admin = svc.client().mcp
    states = admin.states()
    return [_server(s, states.get(s.name)) for s in admin.servers()]


@router.post("/mcp/servers", status_code=201)
def mcp_add(body: dict[str, Any], caller: Admin, svc: Svc) -> list[str]:
    """Add or replace servers from `{"mcpServers": {…}}`."""
    return svc.client().mcp.add(body)


@router.delete("/mcp/servers/{name}", status_code=204)
def mcp_remove(name: Id, caller: Admin, svc: Svc) -> None:
    svc.client().mcp.remove(name)


@router.get("/mcp/tools")
def mcp_tools(caller: Admin, svc: Svc) -> list[McpToolRow]:
    return svc.client().mcp.tools()


@router.get("/mcp/grants")
def mcp_grants(caller: Admin, svc: Svc) -> list[Grant]:
    return svc.client().mcp.grants()


@router.post("/mcp/grants", status_code=201)
def mcp_grant(body: GrantBody, caller: Admin, svc: Svc) -> None:
    svc.client().mcp.grant(
        body.server,
        agent=body.agent,
        user=body.user,
        allow=body.allow,
        deny=body.deny,
        by=f"api:{caller.user_id}",
    )


@router.delete("/mcp/grants/{server}", status_code=204)
def mcp_revoke(
    server: Id, caller: Admin, svc: Svc, agent: str | None = None, user: str | None = None
) -> None:
    svc.client().mcp.revoke(server, agent=agent, user=user)


@router.post("/mcp/requests", status_code=201)
def mcp_request(body: RequestBody, caller: Caller, svc: Svc) -> dict[str, str]:
    """Ask for access: a user for themselves, an admin for anyone."""
    user, agent = body.user, body.agent
    if not caller.admin:
        if agent or (user and user != caller.user_id):
            raise Forbidden("a user may ask access only for themselves")
        user = caller.user_id
    request_id = svc.client().mcp.request(
        body.server,
        agent=agent,
        user=user,
        allow=body.allow,
        reason=body.reason,
        by=f"api:{caller.user_id}",
    )
    return {"id": request_id}


@router.get("/mcp/requests")
def mcp_requests(caller: Admin, svc: Svc, status: str | None = "pending") -> list[AccessRequest]:
    return svc.client().mcp.requests(None if status == "all" else status)


@router.post("/mcp/requests/{request_id}/review")
def mcp_review(request_id: Id, body: Review, caller: Admin, svc: Svc) -> AccessRequest:
    return svc.client().mcp.review(
        request_id, body.decision == "approve", by=f"api:{caller.user_id}"
    )
