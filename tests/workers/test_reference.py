"""The tools' reference (issue 30): docs/tools.md is what the declarations say, and `clawq
tools schema` prints each tool's input and description from the same models."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from orchestrator.cli import main as cli
from workers import reference
from workers.registry import default_registry

DOCS = Path(__file__).resolve().parents[2] / "docs" / "tools.md"


def test_docs_tools_md_is_in_sync_with_the_declarations() -> None:
    made = reference.markdown(default_registry())
    assert DOCS.read_text() == made, (
        "docs/tools.md is out of date: clawq tools schema --markdown > docs/tools.md"
    )
    # what a newcomer had to read the source for
    assert "| `every_s` | integer (≥ 60) |" in made
    assert '| `format` | "html" \\| "markdown" |  | "markdown" |' in made
    assert all(f"\n## {name}\n" in made for name in default_registry().names())


def test_tools_schema_prints_a_tools_input_and_description() -> None:
    one = CliRunner().invoke(cli.main, ["tools", "schema", "cron"])
    assert one.exit_code == 0, one.output
    cron = json.loads(one.stdout)
    assert cron["group"] == "automation" and cron["description"].startswith("Schedule agent")
    every = cron["input_schema"]["properties"]["every_s"]
    assert {"type": "integer", "minimum": 60} in every["anyOf"]
    every_tool = json.loads(CliRunner().invoke(cli.main, ["tools", "schema"]).stdout)
    assert {t["name"] for t in every_tool} == set(default_registry().names())
    unknown = CliRunner().invoke(cli.main, ["tools", "schema", "crontab"])
    assert unknown.exit_code == 2 and "no native tool crontab; tools: " in unknown.stderr
