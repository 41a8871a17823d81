"""The floor: a raw Redis LPUSH/BRPOP echo between two processes."""

from __future__ import annotations

import sys

import redis


def serve(url: str) -> None:
    client = redis.Redis.from_url(url)
    while True:  # idle between (a)'s blocks: a short blocking read, again
        popped = client.brpop(["bench:req"], timeout=1)
        if popped is None:
            continue
        value = popped[1]  # type: ignore[index]
        if value == b"stop":
            return
        client.lpush("bench:resp", value)


if __name__ == "__main__":
    serve(sys.argv[1])
