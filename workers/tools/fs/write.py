"""write_file: create or replace a file, or append to it."""

from __future__ import annotations

from pydantic import Field

from broker.messages import Group
from workers.tool import SideEffect, Tool, ToolContext, ToolInput, ToolResult
from workers.tools.fs.common import WriteRules, workspace, write_text


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

    def run(self, args: WriteFileInput, ctx: ToolContext) -> ToolResult:
        size = write_text(workspace(ctx), args.path, args.content, append=args.append)
        verb = "appended" if args.append else "wrote"
        return ToolResult(
            for_llm=f"{verb} {size} bytes to {args.path}",
            for_user=f"{verb} {args.path}",
            metadata={"bytes": size},
        )
