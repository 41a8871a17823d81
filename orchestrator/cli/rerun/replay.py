"""`clawq replay JOB`: run a recorded job again, its calls answered from its ledger, and
print how the two runs differ (a readable view, or `--json`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestrator.admin.replay import ReplayDiff
from orchestrator.cli.common import cluster
from orchestrator.cli.common import diagnostics as console
from orchestrator.cli.jobs import lost_stack


def _arrow(pair: Any, money: bool = False) -> str:
    show = (lambda v: f"${v:.4f}") if money else str
    if pair.same:
        return show(pair.original)
    return f"{show(pair.original)} → {show(pair.replay)}"


def show_diff(d: ReplayDiff, out: Console) -> None:
    """The diff for a person: what diverged first, then turns, calls, decisions, totals."""
    status = _arrow(d.status)
    out.print(f"[bold]replay {d.replay_id}[/] of {d.original_id}: {status}")
    if d.identical:
        out.print("[green]identical[/]: the same turns, results and final text")
    else:
        out.print(f"[yellow]diverged at turn {d.diverged_at}[/]: {escape(d.divergence)}")
    same = [t.turn for t in d.turns if t.same]
    if same:
        out.print(f"[dim]{len(same)} of {len(d.turns)} turns identical[/]")
    differing = [t for t in d.turns if not t.same]
    if differing:
        turns = Table("turn", "original", "replay", title="turns that differ")
        for t in differing:
            turns.add_row(str(t.turn), escape(t.original), escape(t.replay))
        out.print(turns)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(d.sources.items()))
    out.print(f"calls: {counts}; tools run: {d.tools_run}")
    notable = [c for c in d.calls if c.source != "ledger"]
    if notable:
        calls = Table("turn", "call", "source", "decision", title="calls not from the ledger")
        for c in notable:
            decision = _arrow(c.decision) if c.decision else ""
            calls.add_row(f"{c.turn}.{c.index}", escape(c.summary), c.source, escape(decision))
        out.print(calls)
    for c in d.decisions:
        assert c.decision is not None
        out.print(f"decision of {escape(c.summary)}: {escape(_arrow(c.decision))}")
    if d.final_text.same:
        out.print(f"final text (same): {escape(d.final_text.original[:300])}")
    else:
        out.print(f"final text, original: {escape(d.final_text.original[:300])}")
        out.print(f"final text, replay:   {escape(d.final_text.replay[:300])}")
    out.print(
        f"turns {_arrow(d.iterations)}; tokens {_arrow(d.tokens)}; "
        f"cost {_arrow(d.cost_usd, money=True)}"
    )


def rules(values: tuple[str, ...]) -> list[str] | None:
    return list(values) or None


@click.command()
@click.argument("job_id")
@click.option("--model", default=None, help="Another model (default: the original's).")
@click.option(
    "--script",
    "script_file",
    type=click.Path(exists=True, dir_okay=False),
    help="Another JSON script for the scripted model (default: the original's).",
)
@click.option(
    "--system",
    "system_file",
    type=click.Path(exists=True, dir_okay=False),
    help="A file with another system prompt.",
)
@click.option("--allow", multiple=True, help="Allow rules instead of the original's (repeatable).")
@click.option("--ask", multiple=True, help="Ask rules instead of the original's.")
@click.option("--deny", multiple=True, help="Deny rules instead of the original's.")
@click.option("--agent", default=None, help="Another agent.")
@click.option(
    "--effects",
    type=click.Choice(["block", "sandbox"]),
    default="block",
    show_default=True,
    help="A call the original never made that has an effect: blocked, or run against a "
    "copy of the workspace made now.",
)
@click.option("--timeout", type=float, default=600.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the diff as one JSON object.")
@click.option("--check", is_flag=True, help="Exit 1 unless the replay is identical.")
def replay(
    job_id: str,
    script_file: str | None,
    system_file: str | None,
    allow: tuple[str, ...],
    ask: tuple[str, ...],
    deny: tuple[str, ...],
    timeout: float,
    as_json: bool,
    check: bool,
    **options: Any,
) -> None:
    """Run recorded job JOB_ID again: its calls are answered from its ledger and run
    nothing; what the original never did runs only if it reads (or in a sandbox). Prints
    how the two runs differ."""
    changes = {k: v for k, v in options.items() if v is not None}
    if script_file:
        changes["script"] = json.loads(Path(script_file).read_text())
    if system_file:
        changes["system"] = Path(system_file).read_text()
    for name, given in (("allow", allow), ("ask", ask), ("deny", deny)):
        if given:
            changes[name] = list(given)
    with cluster() as client:
        job = client.replay(job_id, **changes)
        console.print(f"replay {job.id} of {job_id}", markup=False)
        with lost_stack(job.id):
            job.wait(timeout=timeout)
        found = client.replay_diff(job.id)
    if as_json:
        click.echo(found.model_dump_json())
    else:
        show_diff(found, Console(soft_wrap=True))
    sys.exit(1 if check and not found.identical else 0)
