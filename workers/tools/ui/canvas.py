"""canvas: a per-session document the agent shows the user (group ui). Each present or
update is a new version in PostgreSQL; the API's live page (/v1/sessions/{id}/canvas)
shows it within a moment (Redis pub/sub, then Server-Sent Events); snapshot renders the
current version in Chromium with no network at all and returns an image artifact."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from broker.protocol import Group
from broker.stores.canvas import CanvasStore, announce
from workers.tool import SideEffect, Tool, ToolContext, ToolError, ToolInput, ToolResult


class CanvasInput(ToolInput):
    action: Literal["present", "update", "reset", "get", "snapshot"]
    content: str | None = Field(None, description="present/update: the document")
    format: Literal["html", "markdown"] = Field("markdown", description="of content")

    @model_validator(mode="after")
    def _content(self) -> CanvasInput:
        if self.action in ("present", "update") and self.content is None:
            raise ValueError(f"{self.action} needs content")
        return self


class Canvas(Tool[CanvasInput]):
    name = "canvas"
    description = (
        "Show the user a document on the session's canvas (a live page): present or update "
        "it (HTML, or Markdown), reset it, get what is shown, or snapshot it as an image."
    )
    group = Group.ui
    input_model = CanvasInput
    side_effect = SideEffect.write
    default_permission = "allow"
    timeout_s = 20.0

    def summary(self, args: CanvasInput) -> str:
        return f"canvas({args.action})"

    def run(self, args: CanvasInput, ctx: ToolContext) -> ToolResult:
        if ctx.store is None:
            raise ToolError("the canvas needs the database; none is configured here")
        store = CanvasStore(ctx.store().conn, ctx.settings.canvas_keep_versions)
        current = store.current(ctx.session_id)
        if args.action == "get":
            if current is None:
                return ToolResult(for_llm="the canvas is empty", metadata={"version": 0})
            return ToolResult(
                for_llm=f"[canvas version {current.version}, {current.format}]\n{current.content}",
                metadata={"version": current.version},
            )
        if args.action == "snapshot":
            return self._snapshot(ctx, current.html if current else "")
        if args.action == "update" and current is None:
            raise ToolError("the canvas is empty; present something first")
        content = "" if args.action == "reset" else args.content or ""
        if len(content.encode()) > ctx.settings.canvas_max_bytes:
            raise ToolError(f"the canvas takes at most {ctx.settings.canvas_max_bytes} bytes")
        version = store.push(ctx.session_id, content, args.format)
        if ctx.redis is not None:
            announce(ctx.redis, version)
        said = f"canvas version {version.version} shown" if content else "canvas cleared"
        return ToolResult(for_llm=said, for_user=said, metadata={"version": version.version})

    def _snapshot(self, ctx: ToolContext, html: str) -> ToolResult:
        from workers.tools.ui.browser import jpeg
        from workers.tools.ui.engine import engine_for_process

        engine = engine_for_process(ctx.settings)
        raw = engine.call(engine.render(html))
        data, width, height = jpeg(raw)
        stored = ctx.keep_artifact(data, "image/jpeg", "canvas.jpg", width=width, height=height)
        return ToolResult(
            for_llm=f"snapshot of the canvas: {stored.describe()}",
            metadata={"artifact_id": stored.id},
        )
