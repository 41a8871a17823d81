"""A no-op tool and a worker that serves it beside the native tools."""

from __future__ import annotations

import sys

from broker.config.settings import Settings
from broker.protocol import Group
from workers.main import run_worker
from workers.registry import default_registry
from workers.tool import SideEffect, Tool, ToolContext, ToolInput, ToolResult


class NoopInput(ToolInput):
    pass


class Noop(Tool[NoopInput]):
    name = "noop"
    description = "Does nothing; measures the path around a tool."
    group = Group.fs
    input_model = NoopInput
    side_effect = SideEffect.read
    default_permission = "allow"

    def concurrency_safe(self, args: NoopInput) -> bool:
        return True

    def run(self, args: NoopInput, ctx: ToolContext) -> ToolResult:
        return ToolResult(for_llm="ok")


def registry():  # type: ignore[no-untyped-def]
    reg = default_registry()
    reg.register(Noop)
    return reg


if __name__ == "__main__":
    run_worker(
        Settings(),
        registry(),
        "fs",
        concurrency=int(sys.argv[1]),
        pool=sys.argv[2],
        log_level="warning",
    )
