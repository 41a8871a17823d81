"""Custom tools over HTTP, as `clawq tools`: define (PUT), list, show, disable, enable,
remove. Admin keys only. The routes call `orchestrator.admin.custom_tools`, the one
implementation, and raise what it raises."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from broker.stores.custom_tools import CustomTool
from orchestrator.api.deps import Admin, Id, Svc

router = APIRouter(prefix="/v1", tags=["custom-tools"])


@router.get("/custom-tools")
def custom_tools(caller: Admin, svc: Svc) -> list[CustomTool]:
    return svc.client().custom_tools.list()


@router.put("/custom-tools", status_code=201)
def custom_put(body: dict[str, Any], caller: Admin, svc: Svc) -> CustomTool:
    """Define or replace a tool (the definition JSON of `clawq tools add`)."""
    return svc.client().custom_tools.put(body)


@router.get("/custom-tools/{name}")
def custom_show(name: Id, caller: Admin, svc: Svc, agent: str = "") -> CustomTool:
    return svc.client().custom_tools.show(name, agent)


@router.post("/custom-tools/{name}/disable", status_code=204)
def custom_disable(name: Id, caller: Admin, svc: Svc, agent: str = "") -> None:
    svc.client().custom_tools.enable(name, agent, False)


@router.post("/custom-tools/{name}/enable", status_code=204)
def custom_enable(name: Id, caller: Admin, svc: Svc, agent: str = "") -> None:
    svc.client().custom_tools.enable(name, agent, True)


@router.delete("/custom-tools/{name}", status_code=204)
def custom_remove(name: Id, caller: Admin, svc: Svc, agent: str = "") -> None:
    svc.client().custom_tools.remove(name, agent)
