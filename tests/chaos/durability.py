"""What a Redis SIGKILL loses, by `appendfsync` policy: `python -m tests.chaos.durability`.

For each policy, `--trials` times: a Redis of its own (append-only file on), `--writers`
clients each appending numbered entries to a list of its own with RPUSH as fast as they
can, each remembering the last entry Redis acknowledged; after a random 1-3 s redis-server
is killed with SIGKILL and started again on the same files. An acknowledged entry missing
after the restart is lost. Printed per policy: trials, acknowledged writes per second,
and the lost acknowledged writes (total, worst trial).

A SIGKILL kills the process only: what Redis wrote to the file is in the kernel's page
cache and survives it, fsynced or not. The policies differ in when Redis writes (and
fsyncs) its buffer relative to its replies; a power loss or kernel crash (not measured
here: it needs a machine to crash) loses up to a second of writes under `everysec`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from dataclasses import dataclass, field

import redis

from tests.chaos.services import OwnRedis


@dataclass
class Trial:
    acked: int = 0
    lost: int = 0
    seconds: float = 0.0


@dataclass
class Result:
    policy: str
    trials: list[Trial] = field(default_factory=list)

    def row(self) -> str:
        rate = statistics.median(t.acked / t.seconds for t in self.trials)
        lost = [t.lost for t in self.trials]
        hit = sum(1 for n in lost if n)
        return (
            f"| `{self.policy}` | {len(self.trials)} | {rate:,.0f} | {sum(lost)} |"
            f" {max(lost)} | {hit} |"
        )


def trial(policy: str, writers: int) -> Trial:
    server = OwnRedis(fsync=policy)
    server.start()
    acked = [0] * writers
    stop = threading.Event()

    def write(index: int) -> None:
        client = redis.Redis(port=server.port, socket_timeout=2)
        n = 0
        while not stop.is_set():
            try:
                client.rpush(f"w{index}", n + 1)
            except redis.RedisError:
                return  # killed: what was acknowledged is counted
            n += 1
            acked[index] = n

    threads = [threading.Thread(target=write, args=(i,), daemon=True) for i in range(writers)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    time.sleep(random.uniform(1.0, 3.0))
    server.kill()
    seconds = time.monotonic() - started
    stop.set()
    for thread in threads:
        thread.join(5)
    server.start()
    client = redis.Redis(port=server.port)
    kept = [int(client.llen(f"w{i}")) for i in range(writers)]
    client.close()
    server.stop()
    lost = sum(max(0, a - k) for a, k in zip(acked, kept, strict=True))
    return Trial(sum(acked), lost, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.durability")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--writers", type=int, default=8)
    args = parser.parse_args()
    print(
        "| appendfsync | trials | acknowledged writes/s | acknowledged writes lost |"
        " worst trial | trials that lost any |"
    )
    print("|---|---|---|---|---|---|")
    for policy in ("everysec", "always"):
        result = Result(policy, [trial(policy, args.writers) for _ in range(args.trials)])
        print(result.row(), flush=True)


if __name__ == "__main__":
    main()
