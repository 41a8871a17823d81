"""A session's canvas over HTTP: a live page that shows what the agent presents, updated
over Server-Sent Events when it pushes a new version.

The agent's HTML runs in an iframe sandboxed without scripts or same-origin access, under
the page's strict CSP plus its own (no network: nothing but inline styles and data:
images), so what the agent writes can neither script the page nor call anything."""

from __future__ import annotations

import asyncio
import html as html_lib
import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent
from psycopg.rows import dict_row
from pydantic import BaseModel

from broker import keys
from broker.errors import Unauthorized
from broker.stores.canvas import link_key_async, link_opens, sign_link
from orchestrator.api.deps import Id, OwnedSession, Services, Svc, owned_session, principal

router = APIRouter(prefix="/v1", tags=["canvas"])

FRAME_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
SHELL = """<!doctype html><html><head><meta charset="utf-8"><title>canvas</title>
<style>html,body{{margin:0;height:100%}}iframe{{border:0;width:100%;height:100%}}
#bar{{font:12px sans-serif;position:fixed;right:6px;bottom:4px;opacity:.6}}</style></head>
<body><iframe id="canvas" sandbox="" title="canvas"></iframe>
<div id="bar">version <span id="version">0</span></div>
<script nonce="{nonce}">
const frame = document.getElementById("canvas");
const csp = '<meta http-equiv="Content-Security-Policy" content="{frame_csp}">';
const events = new EventSource(location.pathname + "/events" + location.search);
events.addEventListener("version", (e) => {{
  const v = JSON.parse(e.data);
  frame.srcdoc = csp + v.html;
  document.getElementById("version").textContent = v.version;
}});
</script></body></html>"""


async def _current(svc: Services, session_id: str) -> dict[str, Any] | None:
    async with svc.pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            "SELECT version, html FROM canvas_versions WHERE session_id = %s"
            " ORDER BY version DESC LIMIT 1",
            (session_id,),
        )
        return await cur.fetchone()


class CanvasLink(BaseModel):
    url: str
    expires_at: int  # Unix time


@router.get("/sessions/{session_id}/canvas-link")
async def canvas_link(session_id: OwnedSession, request: Request, svc: Svc) -> CanvasLink:
    """A short-lived link to the session's canvas page that a browser opens as it is (a
    browser sends no API key): signed, it names the session and when it expires."""
    key = await link_key_async(svc.redis)
    token, expires = sign_link(key, session_id, svc.settings.canvas_link_ttl_s, time.time())
    url = request.url_for("page", session_id=session_id).include_query_params(token=token)
    return CanvasLink(url=str(url), expires_at=expires)


async def viewer(session_id: Id, request: Request, svc: Svc, token: str | None = None) -> str:
    """Who may see the page and its events: a signed link's token, else an API key."""
    if token is None:
        return await owned_session(session_id, await principal(request, svc), svc)
    if not link_opens(await link_key_async(svc.redis), session_id, token, time.time()):
        raise Unauthorized("this canvas link is wrong or expired: ask for a new one")
    return session_id


Viewed = Annotated[str, Depends(viewer)]


@router.get("/sessions/{session_id}/canvas", response_class=HTMLResponse)
async def page(session_id: Viewed) -> HTMLResponse:
    nonce = secrets.token_urlsafe(16)
    body = SHELL.format(nonce=nonce, frame_csp=html_lib.escape(FRAME_CSP, quote=True))
    csp = (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline';"
        " connect-src 'self'; img-src data:; frame-ancestors 'none'; base-uri 'none'"
    )
    # the link's token stays out of the Referer of anything the page would load
    headers = {"Content-Security-Policy": csp, "Referrer-Policy": "no-referrer"}
    return HTMLResponse(body, headers=headers)


@router.get("/sessions/{session_id}/canvas/events", response_class=EventSourceResponse)
async def canvas_events(session_id: Viewed, svc: Svc) -> AsyncIterator[ServerSentEvent]:
    """The current version at once, then every new one as the agent pushes it."""
    pubsub = svc.redis.pubsub()
    await pubsub.subscribe(keys.canvas(session_id))
    try:
        sent = 0
        while True:
            current = await _current(svc, session_id)
            if current is not None and current["version"] != sent:
                sent = current["version"]
                yield ServerSentEvent(raw_data=json.dumps(current), event="version", id=str(sent))
            message = await pubsub.get_message(
                ignore_subscribe_messages=True, timeout=svc.settings.api_sse_keepalive_s
            )
            if message is None:
                yield ServerSentEvent(comment="keep-alive")
            await asyncio.sleep(0)
    finally:
        await pubsub.unsubscribe()
        await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]
