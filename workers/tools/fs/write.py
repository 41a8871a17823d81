"""write_file: create or replace a file, or append to it."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from broker.protocol import Group
from workers.tool import SideEffect, Tool, ToolContext, ToolInput, ToolResult
from workers.tools.fs.checkpoint import keep_prior
from workers.tools.fs.common import WriteRules, open_to_change, put_text, workspace
from workers.tools.fs.intercept import ROUTED, Interceptor, routed, virtual_path


class WriteFileInput(ToolInput):
    path: str = Field(description="File path, relative to the workspace")
    content: str = Field(description="Text to write")
    append: bool = Field(False, description="Append instead of replacing the file")


class WriteFile(WriteRules, Tool[WriteFileInput]):
    name = "write_file"
    description = (
        "Write a text file in the workspace (created with its directories), or append to it."
    )
    group = Group.fs
    input_model = WriteFileInput
    side_effect = SideEffect.write
    default_permission = "allow"  # contained in the workspace; .git/ stays protected
    timeout_s = 30.0
    waits_for_claim = True  # its checkpoint is stored while its claim is out

    interceptors: ClassVar[tuple[Interceptor, ...]] = ROUTED

    def run(self, args: WriteFileInput, ctx: ToolContext) -> ToolResult:
        if routed_to := routed(self.interceptors, args.path, ctx):
            ctx.claimed()
            rel = virtual_path(args.path, ctx.context.workspace) or args.path
            said = routed_to.write(rel, args.content, ctx, append=args.append)
            return ToolResult(for_llm=said, for_user=said)
        ws = workspace(ctx)
        fh, existed = open_to_change(ws, args.path, ctx, create=True, append=args.append)
        with fh:
            kept = keep_prior(ws, fh, existed, ctx)  # while the claim is out
            ctx.claimed()
            size = put_text(fh, args.content, append=args.append)
        verb = "appended" if args.append else "wrote"
        return ToolResult(
            for_llm=f"{verb} {size} bytes to {args.path}",
            for_user=f"{verb} {args.path}",
            metadata={"bytes": size, **kept},
        )
