"""edit_file: replace an exact string, which must be unique unless replace_all is set."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, model_validator

from broker.protocol import Group
from workers.tool import SideEffect, Tool, ToolContext, ToolError, ToolInput, ToolResult
from workers.tools.fs.checkpoint import keep_prior
from workers.tools.fs.common import (
    MAX_EDIT_BYTES,
    WriteRules,
    decoded,
    open_to_change,
    put_text,
    workspace,
)
from workers.tools.fs.intercept import ROUTED, Interceptor, routed, virtual_path


class EditFileInput(ToolInput):
    path: str = Field(description="File path, relative to the workspace")
    old_string: str = Field(description="Exact text to replace")
    new_string: str = Field(description="Replacement text")
    replace_all: bool = Field(False, description="Replace every occurrence")

    @model_validator(mode="after")
    def _differ(self) -> EditFileInput:
        if not self.old_string:
            raise ValueError("old_string is empty; give the exact text to replace")
        if self.old_string == self.new_string:
            raise ValueError("old_string and new_string are identical; nothing would change")
        return self


class EditFile(WriteRules, Tool[EditFileInput]):
    name = "edit_file"
    description = (
        "Replace old_string with new_string in a file. old_string must match exactly once "
        "(include surrounding lines to make it unique) unless replace_all is true."
    )
    group = Group.fs
    input_model = EditFileInput
    side_effect = SideEffect.write
    default_permission = "allow"  # contained in the workspace; .git/ stays protected
    timeout_s = 30.0
    waits_for_claim = True  # its checkpoint is stored while its claim is out

    interceptors: ClassVar[tuple[Interceptor, ...]] = ROUTED

    def run(self, args: EditFileInput, ctx: ToolContext) -> ToolResult:
        def change(text: str) -> tuple[str, int]:
            count = text.count(args.old_string)
            if count == 0:
                raise ToolError(
                    f"old_string not found in {args.path}; read the file and copy the text exactly"
                )
            if count > 1 and not args.replace_all:
                raise ToolError(
                    f"old_string occurs {count} times in {args.path}; add surrounding context "
                    "to make it unique, or set replace_all"
                )
            return text.replace(args.old_string, args.new_string), count

        kept: dict[str, Any] = {}
        if routed_to := routed(self.interceptors, args.path, ctx):
            ctx.claimed()
            rel = virtual_path(args.path, ctx.context.workspace) or args.path
            said, count = routed_to.edit(rel, ctx, change)
        else:
            ws = workspace(ctx)
            fh, _ = open_to_change(ws, args.path, ctx, create=False)
            with fh:
                updated, count = change(decoded(fh.read(MAX_EDIT_BYTES + 1), args.path))
                kept = keep_prior(ws, fh, True, ctx)  # while the claim is out
                ctx.claimed()
                put_text(fh, updated)
            said = f"edited {args.path}"
        return ToolResult(
            for_llm=f"replaced {count} occurrence{'s' if count > 1 else ''} in {args.path}",
            for_user=said,
            metadata={"replacements": count, **kept},
        )
