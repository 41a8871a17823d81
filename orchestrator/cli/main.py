"""The `clawq` command line: the group and its commands, each from the module of its kind."""

from __future__ import annotations

from typing import Any

import click

from broker.errors import ConfigurationError, RunError
from orchestrator.cli.canvas import canvas
from orchestrator.cli.config import config, secret_key
from orchestrator.cli.cron import cron
from orchestrator.cli.dlq import dlq
from orchestrator.cli.jobs import approve, cancel, run, steer
from orchestrator.cli.keys import keys
from orchestrator.cli.local.commands import demo, up
from orchestrator.cli.mcp import mcp
from orchestrator.cli.memory import context, memory
from orchestrator.cli.ops import health, migrate, status
from orchestrator.cli.processes import api, flower, orchestrator, worker
from orchestrator.cli.requests import answer, requests_
from orchestrator.cli.rerun.evals import evals
from orchestrator.cli.rerun.fork import fork
from orchestrator.cli.rerun.replay import replay
from orchestrator.cli.tools import tools


class Clawq(click.Group):
    """The group: an expected failure (the configuration, a service away, a stack that
    could not start) is one line that says what to do, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (ConfigurationError, RunError) as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=Clawq)
def main() -> None:
    """clawq: distributed tool execution for AI agents, on Celery."""


for command in (
    worker, orchestrator, api, flower, up, demo, status, run, approve, steer, cancel,
    secret_key, config, dlq, memory, context, mcp, tools, keys, cron, canvas, health,
    migrate, requests_, answer, replay, fork, evals,
):  # fmt: skip
    main.add_command(command)

if __name__ == "__main__":
    main()
