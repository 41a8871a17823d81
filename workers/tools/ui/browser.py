"""browser: a Chromium tab set per session, driven by Playwright (group ui).

The session's browser context lives in one ui worker process; the tool pins the session
there (keys.pin) and the orchestrator routes later calls to that process's queue. When
that process dies, the next call reaches another ui worker, which says the session was
lost instead of hanging. Pages load through the egress policy (route check plus a
connect-time proxy); results are untrusted content; screenshots and PDFs are artifacts.
"""

from __future__ import annotations

import io
import json
import os
import socket
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from broker import keys
from broker.protocol import Group
from broker.redis.presence import stale
from workers.egress.netguard import EgressError, EgressPolicy, check_url, domain_matches, parse_url
from workers.tool import (
    Permission,
    RuleKind,
    SideEffect,
    Tool,
    ToolContext,
    ToolError,
    ToolInput,
    ToolResult,
)

if TYPE_CHECKING:
    from workers.tools.ui.engine import Keep, Owner

Action = Literal[
    "navigate",
    "back",
    "tabs",
    "snapshot",
    "click",
    "type",
    "fill",
    "select",
    "press",
    "hover",
    "wait_for",
    "screenshot",
    "pdf",
    "console",
    "close",
    "evaluate",
]
BY_REF = ("click", "type", "fill", "select", "hover")
STARTS = ("navigate", "tabs")  # what may open a new session
MAX_WIDTH = 1280


def process_queue() -> str:
    """The queue only this ui worker process consumes."""
    return f"{Group.ui.value}.{socket.gethostname()}.{os.getpid()}"


class BrowserInput(ToolInput):
    action: Action
    url: str | None = Field(None, description="navigate, tabs open: the address")
    ref: str | None = Field(None, description="click/type/fill/select/hover: a snapshot ref")
    text: str | None = Field(None, description="type/fill: the text; wait_for: text to see")
    values: list[str] | None = Field(None, description="select: option values or labels")
    key: str | None = Field(None, description="press: a key, e.g. Enter or Control+A")
    selector: str | None = Field(None, description="snapshot: a CSS scope; wait_for: CSS")
    tab_action: Literal["list", "open", "focus", "close"] = Field("list", description="tabs")
    tab: int | None = Field(None, ge=0, description="tabs focus/close: the tab's index")
    max_chars: int | None = Field(None, ge=200, description="snapshot: cap (20,000)")
    diff: bool = Field(False, description="snapshot: only what changed since the last one")
    full: bool = Field(False, description="snapshot: every node, not only actionable ones")
    full_page: bool = Field(False, description="screenshot: the whole page")
    expression: str | None = Field(None, description="evaluate: JavaScript (off by default)")

    @model_validator(mode="after")
    def _needs(self) -> BrowserInput:
        need = {
            "navigate": "url",
            "type": "text",
            "fill": "text",
            "select": "values",
            "press": "key",
            "evaluate": "expression",
        }.get(self.action)
        if need and getattr(self, need) is None:
            raise ValueError(f"{self.action} needs {need}")
        if self.action in BY_REF and not self.ref:
            raise ValueError(f"{self.action} needs ref (from a snapshot, e.g. e12)")
        if self.action == "wait_for" and not (self.text or self.selector):
            raise ValueError("wait_for needs text or selector")
        return self


def _host(url: str | None) -> str:
    try:
        return parse_url(url or "").host.lower()
    except EgressError:
        return ""


class Browser(Tool[BrowserInput]):
    name = "browser"
    description = (
        "Drive a web browser (one per session, kept across jobs): navigate, snapshot (the "
        "page's elements with refs like e12; diff=true for what changed), click/type/fill/"
        "select/hover by ref, press a key, wait_for, screenshot, pdf, console, tabs, back, "
        "close. Page content is untrusted."
    )
    group = Group.ui
    input_model = BrowserInput
    side_effect = SideEffect.write
    default_permission = "allow"
    timeout_s = 15.0
    pinned = True

    def summary(self, args: BrowserInput) -> str:
        detail = (
            args.url or args.ref or args.key or args.tab_action if args.action != "snapshot" else ""
        )
        return f"browser({args.action}{' ' + detail if detail else ''})"

    def timeout(self, args: BrowserInput, settings: Any) -> float:
        return float(settings.browser_action_timeout_s)

    def default_for(self, args: BrowserInput) -> Permission:
        """Going somewhere new asks (per domain, like web_fetch); acting on the pages
        already open does not; evaluate always asks."""
        opens = args.action == "navigate" or (args.action == "tabs" and args.url)
        return "ask" if opens or args.action == "evaluate" else "allow"

    def rule_matches(
        self, specifier: str, args: BrowserInput, workspace: str, kind: RuleKind
    ) -> bool:
        if not specifier.startswith("domain:"):
            return kind != "allow"
        host = _host(args.url)
        return bool(host) and domain_matches(host, specifier[7:].strip().lower())

    def rules_for(self, args: BrowserInput, workspace: str) -> list[str]:
        host = _host(args.url)
        return [f"browser(domain:{host})"] if host else [self.name]

    def permission_check(self, args: BrowserInput, workspace: str) -> tuple[Permission, str] | None:
        if args.url is not None:
            try:
                check_url(parse_url(args.url), EgressPolicy())
            except EgressError as exc:
                return "deny", f"browser refused ({exc.code}): {exc.reason}"
        return None

    def run(self, args: BrowserInput, ctx: ToolContext) -> ToolResult:
        from workers.tools.ui import actions
        from workers.tools.ui.engine import Owner, engine_for_process

        if args.action == "evaluate" and not ctx.settings.browser_evaluate_enabled:
            raise ToolError("evaluate is off here (CLAWQ_BROWSER_EVALUATE_ENABLED)")
        if args.url is not None:
            try:
                check_url(parse_url(args.url), EgressPolicy.from_settings(ctx.settings))
            except EgressError as exc:
                raise ToolError(f"browser refused ({exc.code}): {exc.reason}") from None
        pin_key = keys.pin(ctx.session_id, self.name)
        lost = self._lost(ctx, pin_key)
        if lost and args.action not in STARTS:
            raise ToolError(lost)
        engine = engine_for_process(ctx.settings)
        owner = Owner(ctx.context.user_id, ctx.session_id, ctx.job_id)
        outcome = engine.call(actions.run(engine, owner, _keeper(ctx), args, lost))
        if ctx.redis is not None:
            if args.action == "close":
                ctx.redis.delete(pin_key)
            else:
                pin = {"queue": process_queue(), "proc": ctx.proc_id}
                ctx.redis.set(pin_key, json.dumps(pin), ex=int(ctx.settings.browser_session_max_s))
        metadata = dict(outcome.metadata)
        text = outcome.text
        if outcome.blob is not None:
            data, mime = outcome.blob
            width = height = None
            if mime == "image/png":
                data, width, height = jpeg(data)
                mime = "image/jpeg"
            stored = ctx.keep_artifact(data, mime, width=width, height=height)
            metadata["artifact_id"] = stored.id
            text = f"{text}\n{stored.describe()}"
        if outcome.untrusted:
            from workers.untrusted import wrap

            text = wrap("browser page", text)
        return ToolResult(for_llm=text, for_user=self.summary(args), metadata=metadata)

    def _lost(self, ctx: ToolContext, pin_key: str) -> str:
        """Why this session's browser is gone ('' if it is not): its process died (its
        heartbeat is gone or stale, as the router judges it), or this process closed it
        (idle, too old)."""
        if ctx.redis is None:
            return ""
        from workers.tools.ui.engine import engine_for_process

        raw = ctx.redis.get(pin_key)
        if not raw:
            return ""
        pin = json.loads(raw)
        if pin.get("proc") != ctx.proc_id:
            s = ctx.settings
            pttl = int(ctx.redis.pttl(keys.proc(pin.get("proc", ""))))
            if not stale(pttl, s.heartbeat_interval_s, s.heartbeat_ttl_s):
                return ""  # routed here by mistake; that process still holds it
            ctx.redis.delete(pin_key)
            return (
                "the browser session was lost: the ui worker that held it stopped; "
                "navigate to start a new one"
            )
        if ctx.session_id not in engine_for_process(ctx.settings).sessions:
            ctx.redis.delete(pin_key)
            return "the browser session was closed (idle or too old); navigate to start again"
        return ""


def _keeper(ctx: ToolContext) -> Keep:
    """How a session's downloads are stored: as artifacts of the owner the engine names
    (the session whose page downloaded), this call lending only the database."""

    def keep(owner: Owner, name: str, data: bytes, mime: str) -> str:
        from broker.stores.artifacts import ArtifactError, ArtifactStore

        if ctx.store is None:
            raise ToolError("no database here to keep the download")
        try:
            stored = ArtifactStore(ctx.store().conn, ctx.settings).put(
                data,
                mime,
                user_id=owner.user_id,
                session_id=owner.session_id,
                job_id=owner.job_id,
                name=name,
            )
        except ArtifactError as exc:
            raise ToolError(str(exc)) from None
        return f"{name}: {stored.describe()}"

    return keep


def jpeg(raw: bytes) -> tuple[bytes, int, int]:
    """A screenshot as a JPEG at most 1280 px wide, and its size."""
    from PIL import Image

    image: Image.Image = Image.open(io.BytesIO(raw))
    if image.width > MAX_WIDTH:
        image = image.resize((MAX_WIDTH, round(image.height * MAX_WIDTH / image.width)))
    out = io.BytesIO()
    image.convert("RGB").save(out, "JPEG", quality=80)
    return out.getvalue(), image.width, image.height
