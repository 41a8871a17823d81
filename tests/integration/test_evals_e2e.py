"""`clawq eval` on a real cluster, as CI runs it: a suite of 10 cases with the scripted
model (one a replay of a recorded job), JUnit XML written, a broken assertion failing its
case and the run; a second run set beside the first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import Cluster, call, script, start_cluster

CLAWQ = [sys.executable, "-m", "orchestrator.cli"]
USAGE = {"input": 100, "output": 20}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(model_prices={"scripted": [1.0, 1.0]}, approval_timeout_s=2)


def case(name: str, *turns: dict[str, Any], **expect: Any) -> dict[str, Any]:
    return {"name": name, "prompt": f"do {name}", "script": script(*turns), "expect": expect}


def suite(recorded: str) -> dict[str, Any]:
    write = {"tool_calls": [call("w", "write_file", path="n.txt", content="hi")]}
    run = {"tool_calls": [call("x", "exec", command="echo ran")]}
    return {
        "name": "smoke",
        "allow": ["exec"],
        "deny": ["web_fetch"],
        "cases": [
            case("writes", write, {"text": "done"}, final_text={"contains": "done"},
                 calls={"made": [{"name": "write_file", "input": {"path": "n.txt"}}]}),
            case("regex", {"text": "answer: 42"}, final_text={"regex": r"answer: \d+$"}),
            case("json", {"text": '{"ok": true, "n": 3}'},
                 final_text={"schema": {"type": "object", "required": ["ok", "n"],
                                        "properties": {"n": {"type": "integer"}}}}),
            case("exec-allowed", run, {"text": "ok"}, decisions={"exec": "allow"}),
            case("fetch-denied", {"tool_calls": [call("f", "web_fetch", url="http://x.test")]},
                 {"text": "could not"}, decisions={"web_fetch": "deny"}),
            case("not-made", write, {"text": "ok"}, calls={"not_made": ["exec", "web_fetch"]}),
            case("turns", write, {"text": "ok"}, max_turns=2),
            case("tokens", {"text": "a", "tool_calls": [call("l", "list_files")], "usage": USAGE},
                 {"text": "b", "usage": USAGE}, max_tokens=240, max_cost_usd=0.001),
            case("broken", {"text": "something else"}, final_text={"contains": "expected words"}),
            {"name": "replayed", "job": recorded, "expect": {"identical": True,
                                                               "calls": {"made": ["exec"]}}},
        ],
    }  # fmt: skip


def clawq_eval(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **cluster.env}
    return subprocess.run(
        [*CLAWQ, "eval", *args], env=env, capture_output=True, text=True, timeout=240
    )


def test_a_suite_of_10_cases_runs_as_jobs_and_writes_junit(cluster: Cluster) -> None:
    ws = tempfile.mkdtemp(prefix="eval-rec-")
    recorded = cluster.client.submit(
        "record",
        workspace=ws,
        allow=["exec"],
        script=script(
            {"tool_calls": [call("x", "exec", command="echo once >> e.txt")]}, {"text": "ok"}
        ),
    )
    assert recorded.wait(timeout=60).status == "completed"
    folder = Path(tempfile.mkdtemp(prefix="eval-"))
    (folder / "suite.yaml").write_text(yaml.safe_dump(suite(recorded.id)))
    first = clawq_eval(
        cluster, str(folder / "suite.yaml"), "--junit", str(folder / "junit.xml"),
        "--out", str(folder / "run.json"), "--parallel", "5",
    )  # fmt: skip
    assert first.returncode == 1, first.stderr  # the broken case fails the run
    assert "9 passed, 1 failed" in first.stderr
    root = ET.parse(folder / "junit.xml").getroot()
    suite_el = root.find("testsuite")
    assert suite_el is not None and suite_el.get("tests") == "10"
    assert suite_el.get("failures") == "1"
    failed = [c.get("name") for c in suite_el.iter("testcase") if c.find("failure") is not None]
    assert failed == ["broken"]
    failure = next(c for c in suite_el.iter("testcase") if c.get("name") == "broken")
    assert "final text lacks 'expected words'" in (failure.find("failure").get("message") or "")  # type: ignore[union-attr]
    run = json.loads((folder / "run.json").read_text())
    by_name = {c["name"]: c for c in run["cases"]}
    assert by_name["tokens"]["tokens"] == 240 and by_name["tokens"]["cost_usd"] > 0
    assert by_name["fetch-denied"]["passed"] and by_name["replayed"]["passed"]
    assert len({c["job_id"] for c in run["cases"]}) == 10  # each an ordinary job of its own
    assert Path(ws, "e.txt").read_text() == "once\n"  # the replayed case ran nothing
    # a second run under another policy, set beside the first
    second = clawq_eval(
        cluster,
        str(folder / "suite.yaml"),
        *("--deny", "exec", "--deny", "web_fetch"),
        *("--compare", str(folder / "run.json")),
    )
    assert second.returncode == 1
    lines = {line.split()[0]: line.split() for line in second.stdout.splitlines()[1:]}
    assert lines["exec-allowed"][1:4] == ["passed", "failed", "broken"]
    assert lines["broken"][1:3] == ["failed", "failed"]
    assert lines["writes"][1:3] == ["passed", "passed"]


def test_a_suite_with_a_typo_is_refused_with_its_place(cluster: Cluster, tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(
        yaml.safe_dump({"cases": [{"name": "a", "prompt": "p", "expect": {"final_txt": {}}}]})
    )
    out = clawq_eval(cluster, str(tmp_path / "s.yaml"))
    assert out.returncode != 0 and "cases.0.expect.final_txt" in out.stderr
