"""Tables on stdout: plain aligned columns into a pipe (empty ones too), JSON on request."""

from __future__ import annotations

import json

import click
from click.testing import CliRunner

from orchestrator.cli.common import table


def _printing(rows: list[tuple[str, str]], as_json: bool = False) -> str:
    @click.command()
    def show() -> None:
        table(("name", "state"), rows, as_json=as_json)

    result = CliRunner().invoke(show)
    assert result.exit_code == 0, result.output
    return result.output


def test_an_empty_table_prints_its_header_alone() -> None:
    assert _printing([]).splitlines() == ["name  state"]


def test_rows_are_aligned_under_the_widest_cell() -> None:
    lines = _printing([("a-long-name", "up"), ("b", "down")]).splitlines()
    assert lines == ["name         state", "a-long-name  up", "b            down"]


def test_json_gives_objects_by_column() -> None:
    assert json.loads(_printing([("a", "up")], as_json=True)) == [{"name": "a", "state": "up"}]
