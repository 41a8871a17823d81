"""The metrics object is made once per process, however many threads ask at once (a web
worker's threads did, and the second registration raised DuplicateTimeseries)."""

from __future__ import annotations

import subprocess
import sys

RACE = """
import threading
from broker.obs.metrics import metrics
barrier = threading.Barrier(16)
seen, errors = [], []
def ask():
    barrier.wait()
    try:
        seen.append(id(metrics()))
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=ask) for _ in range(16)]
for t in threads: t.start()
for t in threads: t.join()
print(len(set(seen)), len(errors))
"""


def test_threads_asking_at_once_get_one_metrics_object() -> None:
    out = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "0"], out.stderr
