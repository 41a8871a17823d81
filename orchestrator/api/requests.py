"""A person's requests over HTTP: the pending approvals and questions of a user's jobs
(`GET /v1/requests`), a question's answer (`POST /v1/jobs/{id}/inputs/{request_id}`), and
the inbox: a server-rendered page (plain forms, no script) that lists them and answers
them. A browser sends no API key: the inbox opens by a short-lived signed link
(`GET /v1/inbox-link`, `clawq requests --link`) that names its user. Another user's
request is 404, never 403."""

from __future__ import annotations

import html
import json
import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from broker.errors import NotFound, Unauthorized
from broker.stores import requests
from broker.stores.canvas import link_key_async, link_opens, sign_link
from broker.stores.requests import PersonRequest
from orchestrator.api.deps import Caller, Id, Principal, Svc, principal
from orchestrator.api.jobs import OwnedJob

router = APIRouter(prefix="/v1", tags=["requests"])


class Given(BaseModel):
    """A question's answer, or an MCP server's elicitation's: its object, or a decline."""

    model_config = ConfigDict(extra="forbid")
    answer: str | list[str] | dict[str, Any] | None = Field(
        None,
        description="text, or one (or, multi, several) choices; an elicitation's: an object"
        " its schema accepts",
    )
    decline: bool = Field(False, description="an elicitation's: refuse it (the server hears)")

    @model_validator(mode="after")
    def _one(self) -> Given:
        if self.decline == (self.answer is not None):
            raise ValueError("give either an answer or decline: true")
        return self


class InboxLink(BaseModel):
    url: str
    expires_at: int  # Unix time


def _owned(svc: Svc, caller: Principal, request_id: str, job_id: str = "") -> PersonRequest:
    found = requests.request(svc.client().store.conn, request_id)
    if found is None or (job_id and found.job_id != job_id) or not caller.may_see(found.user_id):
        raise NotFound(f"no request {request_id}")
    return found


@router.get("/requests")
def pending(
    caller: Caller,
    svc: Svc,
    status: Literal["pending"] = "pending",
    user: str | None = Query(None, description="an admin's key: one user's (else all)"),
) -> list[PersonRequest]:
    """Pending approvals and questions across the caller's jobs, oldest first."""
    who = (user or None) if caller.admin else caller.user_id
    return svc.client().requests(who)


@router.post("/jobs/{job_id}/inputs/{request_id}", status_code=204)
def answer(
    job_id: Id, request_id: Id, body: Given, job: OwnedJob, caller: Caller, svc: Svc
) -> None:
    """Answer a question or an elicitation (`input_requested`), or decline an elicitation:
    the job's user or an admin."""
    _owned(svc, caller, request_id, job_id)
    target = svc.client().job(job_id)
    target.answer(request_id, body.answer, by=f"api:{caller.user_id}", decline=body.decline)


# -- the inbox page ---------------------------------------------------------------------------


def _subject(user: str, admin: bool) -> str:
    return f"inbox:{'admin' if admin else 'user'}:{user}"


@router.get("/inbox-link")
async def inbox_link(caller: Caller, request: Request, svc: Svc) -> InboxLink:
    """A short-lived link to the caller's inbox page, for a browser (which sends no key)."""
    key = await link_key_async(svc.redis)
    subject = _subject(caller.user_id, caller.admin)
    token, expires = sign_link(key, subject, svc.settings.canvas_link_ttl_s, time.time())
    query = {"user": caller.user_id, "admin": int(caller.admin), "token": token}
    url = str(request.url_for("inbox")) + "?" + urlencode(query)
    return InboxLink(url=url, expires_at=expires)


@dataclass(frozen=True)
class Reader:
    principal: Principal
    query: str  # what every form and link of the page carries on (the signed link)


async def reader(
    request: Request,
    svc: Svc,
    user: str | None = None,
    admin: int = 0,
    token: str | None = None,
) -> Reader:
    """Who reads the inbox: a signed link's user, else an API key's."""
    if token is None or user is None:
        return Reader(principal=await principal(request, svc), query="")
    key = await link_key_async(svc.redis)
    if not link_opens(key, _subject(user, bool(admin)), token, time.time()):
        raise Unauthorized("this inbox link is wrong or expired: ask for a new one")
    query = urlencode({"user": user, "admin": admin, "token": token})
    return Reader(principal=Principal("link", user, bool(admin)), query=query)


Read = Annotated[Reader, Depends(reader)]

PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>clawq inbox</title>
<style>body{{font:14px sans-serif;margin:2em;max-width:60em}}
.req{{border:1px solid #ccc;border-radius:6px;padding:.8em;margin:.8em 0}}
pre{{background:#f6f6f6;padding:.5em;overflow:auto}}.done{{color:#070}}</style></head>
<body><h1>Inbox</h1>{notice}<p id="count">{count} pending</p>{items}</body></html>"""


def _fields(schema: dict[str, Any]) -> str:
    """An elicitation's form: one input per primitive field of the server's schema."""
    esc, out = html.escape, []
    required = set(schema.get("required") or [])
    for name, prop in (schema.get("properties") or {}).items():
        kind, key = prop.get("type", "string"), esc(f"f.{name}", quote=True)
        label = esc(prop.get("title") or prop.get("description") or name)
        need = " required" if name in required else ""
        if kind == "boolean":
            field = f'<input type="checkbox" name="{key}" value="true">'
        elif prop.get("enum"):
            options = "".join(
                f'<option value="{esc(str(v), quote=True)}">{esc(str(v))}</option>'
                for v in prop["enum"]
            )
            field = f'<select name="{key}"{need}>{options}</select>'
        elif kind in ("integer", "number"):
            step = "1" if kind == "integer" else "any"
            field = f'<input type="number" step="{step}" name="{key}"{need}>'
        else:
            field = f'<input name="{key}"{need}>'
        out.append(f"<label>{label} {field}</label><br>")
    return "".join(out)


async def form_fields(request: Request) -> dict[str, str]:
    """An elicitation form's fields (`f.<name>`), by name."""
    form = await request.form()
    return {k[2:]: str(v) for k, v in form.items() if k.startswith("f.")}


def _elicited(req: PersonRequest, fields: dict[str, str]) -> dict[str, str]:
    """The form's fields as the answer: an unticked box is false, an empty optional
    field is left out."""
    schema = req.requested_schema or {}
    required = set(schema.get("required") or [])
    answer = dict(fields)
    for name, prop in (schema.get("properties") or {}).items():
        if prop.get("type") == "boolean":
            answer.setdefault(name, "false")
        if answer.get(name) == "" and name not in required:
            del answer[name]
    return answer


def _item(req: PersonRequest, query: str) -> str:
    esc = html.escape
    action = esc(f"/v1/inbox/{req.id}" + (f"?{query}" if query else ""), quote=True)
    if req.kind == "approval":
        title = f"<b>{esc(req.tool)}</b> needs approval: {esc(req.reason)}"
        detail = f"<pre>{esc(json.dumps(req.input, indent=2, ensure_ascii=False))}</pre>"
        controls = "".join(
            f'<button name="decision" value="{d}">{d}</button> '
            for d in ("allow-once", "allow-always", "deny")
        )
    elif req.kind == "elicitation":
        title = f"<b>{esc(req.tool)}</b> asks: {esc(req.reason)}"
        detail = ""
        controls = _fields(req.requested_schema or {}) + (
            '<button name="decision" value="answered">answer</button> '
            '<button name="decision" value="declined" formnovalidate>decline</button>'
        )
    else:
        q = req.question
        title = f"<b>question</b>: {esc(q.question if q else req.reason)}"
        detail = ""
        if q and q.choices and q.multi:
            controls = (
                "".join(
                    f'<label><input type="checkbox" name="answer" value="{esc(c, quote=True)}">'
                    f"{esc(c)}</label> "
                    for c in q.choices
                )
                + '<button name="decision" value="answered">answer</button>'
            )
        elif q and q.choices:
            controls = "".join(
                f'<button name="answer" value="{esc(c, quote=True)}">{esc(c)}</button> '
                for c in q.choices
            )
        else:
            controls = (
                '<input name="answer" aria-label="answer" required> '
                '<button name="decision" value="answered">answer</button>'
            )
    return (
        f'<div class="req" id="r-{esc(req.id)}"><div>{title}</div>'
        f"<div>job {esc(req.job_id)} · {req.requested_at:%Y-%m-%d %H:%M:%S}</div>{detail}"
        f'<form method="post" action="{action}">{controls}</form></div>'
    )


@router.get("/inbox", response_class=HTMLResponse)
def inbox(reading: Read, svc: Svc, done: str = "") -> HTMLResponse:
    """The reader's pending requests, each with its answer's buttons."""
    caller = reading.principal
    found = svc.client().requests(None if caller.admin else caller.user_id)
    notice = f'<p class="done" id="notice">{html.escape(done)}</p>' if done else ""
    body = PAGE.format(
        notice=notice,
        count=len(found),
        items="".join(_item(r, reading.query) for r in found),
    )
    headers = {
        "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline';"
        " form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        "Referrer-Policy": "no-referrer",  # the link's token stays on this page
    }
    return HTMLResponse(body, headers=headers)


@router.post("/inbox/{request_id}")
def inbox_answer(
    request_id: Id,
    reading: Read,
    svc: Svc,
    fields: Annotated[dict[str, str], Depends(form_fields)],
    decision: Annotated[str, Form()] = "answered",
    answer: Annotated[list[str] | None, Form()] = None,
) -> RedirectResponse:
    """A form of the page: the request answered, then the page again (303)."""
    caller = reading.principal
    req = _owned(svc, caller, request_id)
    job = svc.client().job(req.job_id)
    by = f"inbox:{caller.user_id}"
    if req.kind == "approval":
        job.approve(request_id, decision, by=by, admin=caller.admin)
        said = f"{decision}: {req.tool}"
    elif req.kind == "elicitation" and decision == "declined":
        job.answer(request_id, by=by, decline=True)
        said = f"declined: {req.tool}"
    elif req.kind == "elicitation":
        filled = _elicited(req, fields)
        job.answer(request_id, filled, by=by)
        said = f"answered: {', '.join(f'{k}={v}' for k, v in filled.items())}"
    else:
        given = answer or []
        multi = req.question is not None and req.question.multi
        job.answer(request_id, given if multi else (given[0] if given else ""), by=by)
        said = f"answered: {', '.join(given)}"
    query = "&".join(q for q in (reading.query, urlencode({"done": said})) if q)
    return RedirectResponse(f"/v1/inbox?{query}", status_code=303)
