"""The package as a user installs it (issue 30): a fresh venv made by the machine's python3
with its bundled pip, never upgraded, `pip install .` without the dev extras, then a stack
of that venv's own `clawq` processes runs one call of every tool group that needs no
network beyond loopback.

Python 3.11's pip (23.2) drops an extra whose name differs only in its spelling
(`lxml[html_clean]`, which jusText asks for, is `html-clean` in lxml 6), so a dependency
the suite's upgraded pip brings can be missing here; web_fetch broke that way."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from broker.protocol import Group
from broker.redis.presence import live_processes
from orchestrator.client import Client
from tests.conftest import Isolated
from tests.integration.conftest import call, script
from tests.sites import Reply, Site

ROOT = Path(__file__).resolve().parent.parent
PAGE = (
    b"<html><head><title>Tide</title></head><body><article><h1>Tide</h1>"
    + (b"<p>The tide turns at noon on the north shore of the island, every day.</p>" * 6)
    + b"</article></body></html>"
)
SKILL = "---\nname: tides\ndescription: Reading tide tables.\n---\nHow to read a tide table.\n"
IGNORED = shutil.ignore_patterns(
    ".venv", ".git", "*.egg-info", "__pycache__", ".*_cache", "build", "dist", "tests"
)


def python3() -> str:
    """The machine's python3: the one this suite's venv was made from."""
    return str(Path(sys.base_prefix) / "bin" / "python3")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with clawq installed from a copy of this tree, as `pip install .` does."""
    root = tmp_path_factory.mktemp("install")
    source = root / "src"
    shutil.copytree(ROOT, source, ignore=IGNORED)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    subprocess.run([python3(), "-m", "venv", str(root / "venv")], check=True, env=env)
    pip = [str(root / "venv/bin/python"), "-m", "pip"]
    version = subprocess.run([*pip, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("pip 23."), version.stdout  # the bundled one, as shipped
    done = subprocess.run(
        [*pip, "install", "-q", str(source)], capture_output=True, text=True, env=env, cwd=root
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "venv"


def _ready(client: redis.Redis, groups: set[str]) -> bool:
    live = live_processes(client)
    queues = {p.get("queue") for p in live if p.get("kind") == "worker"}
    return any(p.get("kind") == "orchestrator" for p in live) and groups <= queues


@pytest.mark.timeout(600)
def test_a_plain_pip_install_runs_every_tool_group(venv: Path, tmp_path: Path) -> None:
    skills = tmp_path / "skills" / "tides"
    skills.mkdir(parents=True)
    (skills / "SKILL.md").write_text(SKILL)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with Site({"/page": Reply(200, PAGE, "text/html"), "/hook": Reply(200, b"ok")}) as site:
        overrides = {
            "web_private_allow": [site.endpoint],
            "message_channels": {"hook": {"kind": "webhook", "url": f"{site.url}/hook"}},
            "skill_roots": [str(skills.parent)],
            "workspace_root": str(tmp_path),
            "user_ceilings": {"*": {"workspace_roots": [str(tmp_path)]}},
            "tts_providers": ["espeak"],
        }
        iso = Isolated(**overrides)
        env = {
            **{k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")},
            **iso.env(),
            **{f"CLAWQ_{k.upper()}": json.dumps(v) for k, v in overrides.items()},
            "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
        }
        groups = [g.value for g in Group]
        clawq = str(venv / "bin" / "clawq")
        log = (tmp_path / "stack.log").open("wb")
        commands = [["orchestrator"]] + [
            ["worker", "--group", g, "--concurrency", "1"] for g in groups
        ]
        procs = [
            subprocess.Popen([clawq, *c], env=env, cwd=tmp_path, stdout=log, stderr=log)
            for c in commands
        ]
        client = Client(iso.settings)
        try:
            server = tmp_path / "mcp_server.py"
            shutil.copy(ROOT / "tests/mcp_servers/paged_server.py", server)
            paged = {"command": str(venv / "bin/python"), "args": [str(server)]}
            client.mcp.add({"mcpServers": {"paged": paged}})
            client.mcp.grant("paged", agent="main", by="test")
            with redis.Redis.from_url(iso.redis_url) as r:
                deadline = time.monotonic() + 90
                while not (_ready(r, set(groups)) and client.mcp.tools()):
                    assert time.monotonic() < deadline, "the venv's stack did not come up"
                    assert all(p.poll() is None for p in procs), "a venv process exited"
                    time.sleep(0.3)
            calls = [
                call("fs", "write_file", path="a.txt", content="hello"),
                call("runtime", "exec", command="cat a.txt"),
                call("web", "web_fetch", url=f"{site.url}/page"),
                call("memory", "memory_search", query="tide"),
                call("sessions", "session_status"),
                call("ui", "browser", action="navigate", url=f"{site.url}/page"),
                call("ui2", "canvas", action="present", content="# Tide"),
                call("automation", "cron", action="list"),
                call("messaging", "message", action="send", channel="hook", text="hi"),
                call("media", "skill_search", query="tide table"),
                call("media2", "tts", text="tide"),
                call("mcp", "mcp_paged__t0"),
            ]
            job = client.submit(
                "one of each",
                script=script(*({"tool_calls": [c]} for c in calls), {"text": "done"}),
                workspace=str(workspace),
                allow=["exec", "web_fetch", "cron", "message", "browser"],
            )
            result = job.wait(timeout=120)
        finally:
            client.close()
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
            iso.drop()
            log.close()
    by_id = {c.id: c for c in result.tool_calls}
    failed = {c.id: c.output[:300] for c in result.tool_calls if c.is_error}
    assert failed == {} and result.status == "completed", failed or result.error
    assert {c.queue.split(".")[0] for c in result.tool_calls} == set(groups)
    assert "The tide turns at noon" in by_id["web"].output
    assert "hello" in by_id["runtime"].output
    assert "tides" in by_id["media"].output
    assert [s.path for s in site.seen].count("/hook") == 1
