"""`make chaos`: the long form of the chaos suite.

`python -m tests.chaos [--jobs 100] [--minutes 5] [--steps 50] [--concurrent 12]`: jobs of
scripted `exec` steps (each appends a line to the job's own file) are fed to a cluster of
real processes, `--concurrent` at a time, while faults of every kind are injected at
random, one every 8-15 s, for `--minutes`; then every job must end. Printed: how many
effects were lost or repeated (counted from the files), every job's end, and a table of
fault kind → recovery time, from the service's return to the next progress of every job
that was running then. Exit 1 when anything was lost, repeated untold or unended.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time

from tests.chaos.harness import FAULTS, Chaos, say

STEP_SLEEP_S = 0.3
GAP_S = (8.0, 15.0)  # between faults: each recovers before the next


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--steps", type=int, default=50, help="exec steps per job")
    parser.add_argument("--concurrent", type=int, default=12, help="jobs running at once")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with Chaos(runtime_workers=2, concurrency=4, orchestrators=2, log_level="error") as chaos:
        stop = threading.Event()
        feeder = threading.Thread(
            target=feed, args=(chaos, args.jobs, args.concurrent, args.steps, stop), daemon=True
        )
        feeder.start()
        started = time.monotonic()
        end = started + args.minutes * 60
        while time.monotonic() < end:
            time.sleep(rng.uniform(*GAP_S))
            if time.monotonic() >= end:
                break
            kind = rng.choice(FAULTS)
            say(f"injecting {kind}")
            chaos.inject(kind)
        say("faults over; waiting for every job to end")
        feeder.join()
        ended = chaos.wait_all(600)
        stop.set()
        verdict = chaos.verdict()
        effects = sum(j.steps for j in chaos.jobs.values())
        print()
        print(
            f"{len(chaos.jobs)} jobs, {effects} effects, {len(chaos.faults)} faults in"
            f" {(time.monotonic() - started) / 60:.1f} min: lost {len(verdict.lost)},"
            f" repeated untold {len(verdict.repeated)}, ran again after a kill (told)"
            f" {len(verdict.told)}, failed {len(verdict.failed)},"
            f" unended {len(verdict.unended)}"
        )
        print()
        print(chaos.table())
        if not (ended and verdict.ok):
            print(f"\nFAILED: {verdict}", file=sys.stderr)
            return 1
    return 0


def feed(chaos: Chaos, jobs: int, concurrent: int, steps: int, stop: threading.Event) -> None:
    """Keep `concurrent` jobs running until `jobs` were submitted."""
    submitted = 0
    while submitted < jobs and not stop.is_set():
        if len(chaos.running()) < concurrent:
            chaos.submit(steps, STEP_SLEEP_S)
            submitted += 1
        else:
            time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
