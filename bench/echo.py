"""The floor: a raw Redis LPUSH/BRPOP echo between two processes."""

from __future__ import annotations

import sys

import redis


def serve(url: str) -> None:
    client = redis.Redis.from_url(url)
    while True:
        _, value = client.brpop(["bench:req"])  # type: ignore[misc]
        if value == b"stop":
            return
        client.lpush("bench:resp", value)


if __name__ == "__main__":
    serve(sys.argv[1])
