"""A worker whose `stall` tool sleeps past its time limits, for the pool's tests:
`python -m tests.stall_worker CONCURRENCY POOL`."""

from __future__ import annotations

import os
import sys
import time

from pydantic import Field

from broker.config.settings import Settings
from broker.protocol import Group
from workers.main import run_worker
from workers.registry import Registry, default_registry
from workers.tool import SideEffect, Tool, ToolContext, ToolInput, ToolResult


class StallInput(ToolInput):
    seconds: float = Field(ge=0)
    ignore_soft_limit: bool = False  # a call that swallows the soft limit and goes on
    runs: str = ""  # a file each run appends its process id to (how often it started)


class Stall(Tool[StallInput]):
    name = "stall"
    description = "Sleeps; measures nothing, tests the time limits."
    group = Group.fs
    input_model = StallInput
    side_effect = SideEffect.read
    default_permission = "allow"

    def run(self, args: StallInput, ctx: ToolContext) -> ToolResult:
        if args.runs:
            with open(args.runs, "a") as fh:
                fh.write(f"{os.getpid()}\n")
        until = time.monotonic() + args.seconds
        while (left := until - time.monotonic()) > 0:
            try:
                time.sleep(left)
            except BaseException:
                if not args.ignore_soft_limit:
                    raise
        return ToolResult(for_llm="slept")


def registry() -> Registry:
    reg = default_registry()
    reg.register(Stall)
    return reg


if __name__ == "__main__":
    run_worker(Settings(), registry(), "fs", int(sys.argv[1]), sys.argv[2], "warning")
