"""(v) what scrubbing a tool result costs the worker: the scrubber as it runs (RE2 says in one
pass which rules can match and where, and Python's engine tries only those, only there)
against every rule run on Python's engine over the whole text, as it ran before, on the
same texts, turn about in interleaved rounds, in process."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from rich.console import Console

from bench.rounds import ROUNDS, Rounds
from workers.scrub import Scrubber

PAGE = 256 * 1024  # read_file's page (read_max_bytes)
REPEATS = int(os.environ.get("BENCH_SCRUB_REPEATS", "20"))


class EveryRule(Scrubber):
    """Each rule run on the whole text, whatever it holds: the scrubber before the prefilter."""

    def spans(self, text: str):  # type: ignore[no-untyped-def]
        for index, matches in self.prefilter.everywhere(text):
            yield from (self.rules[index][1](text, m) for m in matches)


def texts() -> dict[str, str]:
    root = Path(__file__).parents[1]
    sources = "".join(p.read_text() for p in sorted(root.glob("orchestrator/**/*.py")))
    prose = (root / "README.md").read_text()
    return {
        "a read_file page of Python source (256 KB)": (sources * 4)[:PAGE],
        "a page of prose (100 KB, the README)": (prose * 2)[:100_000],
        "a short result (`wrote 40 bytes to a.txt`)": "wrote 40 bytes to a.txt",
    }


def timed(scrub: Scrubber, text: str, unit: float) -> float:
    times = []
    for _ in range(REPEATS if len(text) > 1000 else 1000):
        started = time.perf_counter()
        scrub(text)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * unit


def run(console: Console) -> None:
    now, before = Scrubber(), EveryRule()
    for text in texts().values():
        if now(text) != before(text):
            raise RuntimeError("the prefiltered scrubber redacted otherwise than every rule")
    for name, text in texts().items():
        unit, scale = ("ms", 1e3) if len(text) > 1000 else ("µs", 1e6)
        rounds = Rounds(unit)
        for _ in range(ROUNDS):
            rounds.add("every rule, Python's engine (before)", timed(before, text, scale))
            rounds.add("RE2 prefilter, then the rules where it points", timed(now, text, scale))
        console.print(rounds.table(f"(v) scrubbing {name}", "every rule, Python's engine (before)"))
