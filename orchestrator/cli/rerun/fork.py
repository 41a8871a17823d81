"""`clawq fork JOB --at TURN`: a new job in a new session that goes on from a recorded
job's turn, in a copy of its workspace as it was after that turn."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from rich.markup import escape

from orchestrator.cli.common import cluster
from orchestrator.cli.common import diagnostics as console
from orchestrator.cli.jobs import lost_stack, show_event


@click.command()
@click.argument("job_id")
@click.option("--at", "turn", type=int, required=True, help="The turn (1-based) to go on after.")
@click.option("--message", default="", help="The fork's next user input.")
@click.option(
    "--workspace",
    type=click.Path(file_okay=False),
    default="",
    help="Where the fork's workspace is made (default: beside the job's).",
)
@click.option("--model", default="", help="Go on with another model (default: the job's).")
@click.option(
    "--script",
    "script_file",
    type=click.Path(exists=True, dir_okay=False),
    help="Another JSON script for the scripted model (its turns count from the job's first).",
)
@click.option("--wait/--no-wait", default=True, show_default=True, help="Follow the fork.")
@click.option("--timeout", type=float, default=600.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the fork as one JSON object.")
def fork(
    job_id: str,
    turn: int,
    message: str,
    workspace: str,
    model: str,
    script_file: str | None,
    wait: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Fork recorded job JOB_ID after turn TURN: its transcript up to there, its files as
    they were then (from write_file and edit_file checkpoints; exec changes are not
    undone, and are listed)."""
    with cluster() as client:
        made = client.fork(
            job_id,
            turn,
            message=message,
            workspace=os.path.abspath(workspace) if workspace else "",
            model=model,
            script=json.loads(Path(script_file).read_text()) if script_file else None,
        )
        console.print(f"fork {made.job_id} of {job_id} after turn {turn}, in {made.workspace}")
        for note in made.untracked:
            console.print(f"[yellow]not undone:[/] {escape(note)}")
        status = "queued"
        if wait:
            job = client.job(made.job_id)
            with lost_stack(job.id):
                for event in job.events():
                    if not as_json:
                        show_event(event)
                result = job.wait(timeout=timeout)
            status = result.status
            if not as_json:
                click.echo(result.final_text or result.error)
    if as_json:
        click.echo(made.model_dump_json())
    sys.exit(0 if status in ("completed", "queued") else 1)
