"""Interleaved rounds: clawq and its baselines measured turn about, round after round, in one
run, so that a shared machine's drift (a VM's speed changes by half within minutes) weighs
on each alike. Each path gives one figure per round (a median of its samples, or a rate);
what is printed is the median over the rounds and their spread (lowest to highest), and the
ratio to the baseline taken round by round, with its spread."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

from rich.table import Table

ROUNDS = max(5, int(os.environ.get("BENCH_ROUNDS", "5")))


@dataclass
class Rounds:
    """Per path, one figure per round; `lower_is_better` for times, not for rates."""

    unit: str
    lower_is_better: bool = True
    figures: dict[str, list[float]] = field(default_factory=dict)

    def add(self, path: str, figure: float) -> None:
        self.figures.setdefault(path, []).append(figure)

    def median(self, path: str) -> float:
        return statistics.median(self.figures[path])

    def ratios(self, path: str, baseline: str) -> list[float]:
        """clawq's cost against the baseline's, round by round (>1: clawq is slower)."""
        pairs = zip(self.figures[path], self.figures[baseline], strict=False)
        if self.lower_is_better:
            return [ours / base for ours, base in pairs]
        return [base / ours for ours, base in pairs]

    def ratio(self, path: str, baseline: str) -> float:
        return statistics.median(self.ratios(path, baseline))

    def table(self, title: str, baseline: str, notes: dict[str, str] | None = None) -> Table:
        """One row per path: the median over the rounds, their spread, and the ratio to
        `baseline` (its median over the rounds and spread)."""
        n = min(len(v) for v in self.figures.values())
        kind = "cost vs" if self.lower_is_better else "slower than"
        table = Table(title=f"{title} ({n} interleaved rounds)")
        for col in (
            "path",
            f"median {self.unit}",
            "spread (rounds)",
            f"{kind} {baseline}",
            "ratio spread",
        ):
            table.add_column(col, justify="right")
        for path, values in self.figures.items():
            ratios = self.ratios(path, baseline)
            label = f"{path} ({notes[path]})" if notes and path in notes else path
            table.add_row(
                label,
                _num(self.median(path)),
                f"{_num(min(values))} to {_num(max(values))}",
                f"{statistics.median(ratios):.2f}x",
                f"{min(ratios):.2f} to {max(ratios):.2f}x",
            )
        return table


def _num(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.3f}" if value < 10 else f"{value:.2f}"
