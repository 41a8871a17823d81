"""`clawq eval SUITE.yaml`: a suite's cases run as ordinary jobs in parallel, each judged
by its assertions; a table (or `--json`), JUnit XML for CI (`--junit`), the run kept as
JSON (`--out`) and set beside an earlier one (`--compare`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.markup import escape

from broker.errors import Invalid
from orchestrator.admin.evals import (
    CaseResult,
    Overrides,
    SuiteRun,
    compare,
    junit,
    load_suite,
    run_suite,
)
from orchestrator.cli.common import cluster, table
from orchestrator.cli.common import diagnostics as console


def read_run(path: str) -> SuiteRun:
    try:
        return SuiteRun.model_validate_json(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise Invalid(f"cannot read the earlier run {path}: {str(exc).splitlines()[0]}") from None


def show_compare(before: SuiteRun, after: SuiteRun) -> None:
    rows = []
    for c in compare(before, after):
        mark = "" if c.before == c.after else ("fixed" if c.after == "passed" else "broken")
        rows.append(
            [
                c.name,
                c.before,
                c.after,
                mark,
                f"{c.turns[0]} → {c.turns[1]}",
                f"{c.tokens[0]} → {c.tokens[1]}",
                f"${c.cost_usd[0]:.4f} → ${c.cost_usd[1]:.4f}",
            ]
        )
    table(["case", "before", "after", "change", "turns", "tokens", "cost"], rows)


@click.command(name="eval")
@click.argument("suite_file", metavar="SUITE.yaml", type=click.Path(exists=True, dir_okay=False))
@click.option("--model", default=None, help="The model of every case (default: the suite's).")
@click.option("--allow", multiple=True, help="Allow rules instead of the suite's (repeatable).")
@click.option("--ask", multiple=True, help="Ask rules instead of the suite's.")
@click.option("--deny", multiple=True, help="Deny rules instead of the suite's.")
@click.option("--parallel", type=int, default=None, help="Cases at once (default: eval_parallel).")
@click.option("--junit", "junit_file", type=click.Path(dir_okay=False), help="Write JUnit XML.")
@click.option("--out", "out_file", type=click.Path(dir_okay=False), help="Write the run as JSON.")
@click.option(
    "--compare",
    "compare_file",
    type=click.Path(exists=True, dir_okay=False),
    help="An earlier run's JSON (--out) to set this one beside.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the run as JSON instead of a table.")
def evals(
    suite_file: str,
    model: str | None,
    allow: tuple[str, ...],
    ask: tuple[str, ...],
    deny: tuple[str, ...],
    parallel: int | None,
    junit_file: str | None,
    out_file: str | None,
    compare_file: str | None,
    as_json: bool,
) -> None:
    """Run an eval suite: each case (a prompt and its script, or a recorded job to replay)
    as a job, judged by its assertions. Exits 1 if any case failed."""
    suite = load_suite(suite_file)
    before = read_run(compare_file) if compare_file else None
    given = allow or ask or deny
    over = Overrides(
        model=model,
        allow=list(allow) if given else None,
        ask=list(ask) if given else None,
        deny=list(deny) if given else None,
    )

    def done(result: CaseResult) -> None:
        mark = "[green]✓[/]" if result.passed else "[red]✗[/]"
        why = escape("; ".join(result.failures))
        console.print(f"{mark} {escape(result.name)} [dim]{result.job_id}[/] {why}")

    with cluster() as client:
        console.print(f"suite {suite.name}: {len(suite.cases)} cases", markup=False)
        run = run_suite(client, suite, over, parallel or client.settings.eval_parallel, done)
    if out_file:
        Path(out_file).write_text(run.model_dump_json(indent=2))
    if junit_file:
        Path(junit_file).write_text(junit(run))
    if as_json:
        click.echo(run.model_dump_json())
    elif before is not None:
        show_compare(before, run)
    else:
        rows = [
            [
                c.name,
                "pass" if c.passed else "FAIL",
                c.status,
                c.turns,
                c.tokens,
                f"${c.cost_usd:.4f}",
                f"{c.seconds:.2f}s",
                "; ".join(c.failures),
            ]
            for c in run.cases
        ]
        table(["case", "result", "status", "turns", "tokens", "cost", "time", "failures"], rows)
    console.print(
        f"{len(run.cases) - run.failed} passed, {run.failed} failed in {run.seconds:.1f}s"
    )
    sys.exit(1 if run.failed else 0)
