"""One configuration for every command (issue 30): `clawq.toml` in the working directory and
`~/.clawq/config.toml` beside the environment, list settings as comma-separated values, a
bad value as one line, `clawq config show` naming each setting's source (env, file,
default, live), and `clawq run` naming what it was given that the running stack lacks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from broker.config.live import LiveConfigStore
from broker.config.loading import digests, load_settings
from broker.config.settings import Settings
from broker.pg.store import Store
from orchestrator.cli import main as cli
from orchestrator.cli.jobs import stack_settings_note
from orchestrator.cli.local.state import StackState
from tests.conftest import Isolated


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory and a clawq home of the test's own, with no CLAWQ_ variable."""
    for name in list(os.environ):
        if name.startswith("CLAWQ_"):
            monkeypatch.delenv(name)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("CLAWQ_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def clawq(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli.main, list(args), env=env)


def one_line(result: Result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_config_show_names_where_each_setting_comes_from(home: Path, isolated: Isolated) -> None:
    (home / "config.toml").write_text('openai_model = "from-home"\nmax_iterations = 9\n')
    Path("clawq.toml").write_text(
        'openai_model = "from-cwd"\nweb_private_allow = ["127.0.0.1:8765"]\n'
    )
    store = Store(isolated.database_url)
    LiveConfigStore(store.conn).apply(isolated.settings, {"rate_limit_per_hour": 5}, "test")
    store.close()
    env = {
        **isolated.env(),
        "CLAWQ_MAX_ITERATIONS": "7",
        "CLAWQ_OPENAI_API_KEY": "sk-very-secret",
        "CLAWQ_DATABASE_URL": isolated.database_url,
    }
    result = clawq("config", "show", "--json", env=env)
    assert result.exit_code == 0, result.output
    shown = {row["setting"]: (row["value"], row["source"]) for row in json.loads(result.stdout)}
    assert shown["openai_model"] == ("from-cwd", str(Path.cwd() / "clawq.toml"))
    assert shown["web_private_allow"][1] == str(Path.cwd() / "clawq.toml")
    assert shown["max_iterations"] == (7, "env")  # the environment over both files
    assert shown["api_port"] == (8420, "default")
    assert shown["rate_limit_per_hour"] == (5, "live (version 1)")
    assert shown["openai_api_key"] == ("(set)", "env")
    assert "sk-very-secret" not in result.output
    assert set(shown) == set(Settings.model_fields)
    # the file in the home alone, when the working directory has none
    Path("clawq.toml").unlink()
    assert load_settings().openai_model == "from-home"
    assert load_settings().max_iterations == 9


def test_list_settings_take_comma_separated_values(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAWQ_WEB_PRIVATE_ALLOW", "127.0.0.1:8765, 10.0.0.0/8")
    monkeypatch.setenv("CLAWQ_TTS_PROVIDERS", "edge,espeak")
    settings = load_settings()
    assert settings.web_private_allow == ["127.0.0.1:8765", "10.0.0.0/8"]
    assert settings.tts_providers == ["edge", "espeak"]
    monkeypatch.setenv("CLAWQ_WEB_PRIVATE_ALLOW", '["127.0.0.1:1"]')  # JSON as before
    assert load_settings().web_private_allow == ["127.0.0.1:1"]


@pytest.mark.parametrize(
    ("env", "toml", "expected"),
    [
        (
            {"CLAWQ_MAX_ITERATIONS": "0"},
            "",
            "CLAWQ_MAX_ITERATIONS='0': Input should be greater than or equal to 1",
        ),
        (
            {"CLAWQ_MESSAGE_CHANNELS": "ops"},
            "",
            "CLAWQ_MESSAGE_CHANNELS='ops': expected JSON: an object",
        ),
        (
            {"CLAWQ_TTS_PROVIDERS": "espeak,nope"},
            "",
            "CLAWQ_TTS_PROVIDERS.1='nope': Input should be 'espeak', 'openai'",
        ),
        ({}, 'max_iterations = "many"\n', "max_iterations (in {cwd}/clawq.toml)='many': "),
        ({}, "max_iteration = 3\n", "{cwd}/clawq.toml: 'max_iteration' is not a setting"),
        ({}, "max_iterations = \n", "{cwd}/clawq.toml: not valid TOML"),
    ],
)
def test_a_bad_value_is_one_line_naming_it(
    home: Path, env: dict[str, str], toml: str, expected: str
) -> None:
    if toml:
        Path("clawq.toml").write_text(toml)
    line = one_line(clawq("config", "show", env=env))
    assert line.startswith("Error: " + expected.format(cwd=Path.cwd()))
    assert "Traceback" not in line


def test_run_names_the_settings_the_running_stack_lacks(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Provider and tool settings belong to the stack; one given only to `clawq run` would
    be unused, so run says so (the stack's state file keeps digests of what it started
    with)."""
    Path("clawq.toml").write_text('openai_model = "shared"\n')
    started_with = load_settings()  # what `clawq up` read, from the same file
    state = StackState(
        redis_url="redis://127.0.0.1:6379/0",
        database_url="postgresql://postgres@127.0.0.1:5432/test",
        pid=os.getpid(),  # alive
        data=str(home / "data"),
        settings=digests(started_with),
    )
    (home / "stack.json").write_text(state.model_dump_json())
    stack_settings_note()
    assert capsys.readouterr().err == ""  # the file both read: nothing to say

    monkeypatch.setenv("CLAWQ_OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("CLAWQ_WEB_PRIVATE_ALLOW", "127.0.0.1:8765")
    stack_settings_note()
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2, said
    assert said[0].startswith("CLAWQ_OPENAI_BASE_URL is not the running stack's")
    assert said[1].startswith("CLAWQ_WEB_PRIVATE_ALLOW is not the running stack's")
    assert "restart it with this setting" in said[0]


def test_a_worker_takes_several_light_groups_but_not_runtime_web_or_ui(home: Path) -> None:
    line = one_line(clawq("worker", "--group", "fs,runtime,ui"))
    assert line == (
        "Error: runtime, ui need a worker of their own (their pools and host queues); only the"
        " other groups share one"
    )
    unknown = clawq("worker", "--group", "fs,disk")
    assert unknown.exit_code == 2 and "disk: not a group" in unknown.stderr
