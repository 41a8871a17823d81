"""Partitioning a turn's calls: consecutive concurrency-safe calls run together, others alone."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def partition(calls: Sequence[T], safe: Callable[[T], bool]) -> list[list[T]]:
    """Batches in model order: a run of safe calls is one batch; each unsafe call is its own."""
    batches: list[list[T]] = []
    for call in calls:
        if batches and safe(call) and safe(batches[-1][0]):
            batches[-1].append(call)
        else:
            batches.append([call])
    return batches
