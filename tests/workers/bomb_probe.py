"""Run in a fresh process: fetch a gzip bomb through the egress client and print, as JSON,
how much memory that cost (Python's allocations by tracemalloc, and the growth of the
peak resident set), so a test can bound it without the noise of its own process.

    python -m tests.workers.bomb_probe URL ENDPOINT CAP_BYTES
"""

from __future__ import annotations

import json
import sys
import tracemalloc

from workers.egress.client import Egress
from workers.egress.netguard import EgressPolicy, parse_private_allow


def peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM: not `ru_maxrss`, which keeps the peak of
    the process that forked it across the exec)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main() -> None:
    url, endpoint, cap = sys.argv[1], sys.argv[2], int(sys.argv[3])
    networks, endpoints = parse_private_allow([endpoint])
    policy = EgressPolicy(
        private_networks=networks, private_endpoints=endpoints, max_body_bytes=cap
    )
    client = Egress(policy)
    client.request("GET", f"http://{endpoint}/warm")  # imports, the pool: not the bomb
    rss_before = peak_rss_mib()
    got = client.request("GET", url)
    rss_growth = peak_rss_mib() - rss_before
    tracemalloc.start()
    again = client.request("GET", url)
    traced_peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    print(
        json.dumps(
            {
                "body": len(got.body),
                "truncated": got.truncated and again.truncated,
                "rss_growth_mib": round(rss_growth, 1),
                "traced_peak_mib": round(traced_peak, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
