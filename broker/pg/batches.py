"""A statement that writes the rows of many callers at once, where a row at fault fails
only its own caller."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg

Item = TypeVar("Item")


async def each_result(
    items: list[Item], execute: Callable[[list[Item]], Awaitable[list[Any]]]
) -> list[Any]:
    """`execute(items)`'s results, one per item. A batch that fails on a row (a constraint,
    bad data) is executed again one item at a time: each gets its result or its error. A
    lost connection (`OperationalError`) is not a row's fault: it fails them all."""
    try:
        return await execute(items)
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:
        if len(items) == 1:
            return [exc]
    results: list[Any] = []
    for item in items:
        try:
            results.extend(await execute([item]))
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            results.append(exc)
    return results
