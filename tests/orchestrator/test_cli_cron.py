"""`clawq cron list|add|remove|runs` (issue 30) on a real PostgreSQL: the rows the cron tool
reads and the orchestrators tick, made and read by a person."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from broker.pg.store import Store
from broker.stores.cron import CronStore
from orchestrator.cli import main as cli
from tests.conftest import Isolated


def clawq(iso: Isolated, *args: str) -> Result:
    return CliRunner().invoke(cli.main, list(args), env=iso.env())


def test_cron_from_the_command_line(isolated: Isolated, tmp_path: Path) -> None:
    added = clawq(
        isolated, "cron", "add", "standup", "--cron", "0 9 * * 1-5", "--timezone",
        "Europe/Berlin", "--prompt", "summarise the day", "--workspace", str(tmp_path),
        "--allow", "read_file",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert added.stdout.startswith("added standup: ")
    every = clawq(isolated, "cron", "add", "poll", "--every", "300", "--prompt", "check")
    assert every.exit_code == 0, every.output

    listed = json.loads(clawq(isolated, "cron", "list", "--json").stdout)
    assert [j["name"] for j in listed] == ["poll", "standup"]
    standup = listed[1]
    assert standup["schedule"]["timezone"] == "Europe/Berlin"
    assert standup["rules"]["allow"] == ["read_file"] and standup["next_at"]
    table = clawq(isolated, "cron", "list").stdout.splitlines()
    assert table[0].split() == ["name", "schedule", "next", "enabled", "model", "prompt"]

    store = Store(isolated.database_url)
    try:  # the same rows the tool and the ticker use
        assert CronStore(store.conn).get("main", "", "poll") is not None
    finally:
        store.close()
    runs = clawq(isolated, "cron", "runs", "poll", "--json")
    assert runs.exit_code == 0 and json.loads(runs.stdout) == []

    removed = clawq(isolated, "cron", "remove", "poll")
    assert removed.exit_code == 0, removed.output
    assert [j["name"] for j in json.loads(clawq(isolated, "cron", "list", "--json").stdout)] == [
        "standup"
    ]


def test_cron_refusals_are_one_line(isolated: Isolated) -> None:
    short = clawq(isolated, "cron", "add", "fast", "--every", "30", "--prompt", "x")
    assert short.exit_code == 2
    assert short.stderr.strip().splitlines()[-1] == (
        "Error: every_s: Input should be greater than or equal to 60"
    )
    both = clawq(
        isolated, "cron", "add", "x", "--every", "60", "--cron", "* * * * *", "--prompt", "x"
    )
    assert "give one of --at, --every or --cron" in both.stderr
    gone = clawq(isolated, "cron", "remove", "nothing")
    assert gone.exit_code == 2
    assert gone.stderr.strip().splitlines()[-1] == (
        "Error: no scheduled job nothing of agent main; clawq cron list shows them"
    )
