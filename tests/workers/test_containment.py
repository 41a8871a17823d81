"""Every kind of path escape comes back as an error, and nothing outside is read or written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.workers.conftest import Runner


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("TOP SECRET\n")
    return secret


def _escapes(workspace: Path, outside: Path) -> dict[str, str]:
    """Plant every kind of escape in the workspace; return path kinds → workspace paths."""
    (workspace / "link_dir").symlink_to(outside.parent)
    (workspace / "link_file").symlink_to(outside)
    (workspace / "sub").mkdir()
    (workspace / "sub" / "deep_link").symlink_to("../../outside")
    os.link(outside, workspace / "hard")
    return {
        "dotdot": "../outside/secret.txt",
        "dotdot_nested": "sub/../../outside/secret.txt",
        "absolute": str(outside),
        "symlinked_dir": "link_dir/secret.txt",
        "symlinked_file": "link_file",
        "symlink_in_middle": "sub/deep_link/secret.txt",
        "hard_link": "hard",
    }


def test_reads_that_escape_are_errors(run_tool: Runner, workspace: Path, outside: Path) -> None:
    for kind, path in _escapes(workspace, outside).items():
        result = run_tool("read_file", path=path)
        assert result.is_error, kind
        assert "TOP SECRET" not in result.for_llm, kind
        assert "workspace" in result.for_llm or "hard link" in result.for_llm, kind


def test_writes_and_edits_that_escape_change_nothing(
    run_tool: Runner, workspace: Path, outside: Path
) -> None:
    before = set(os.listdir(outside.parent))
    for kind, path in _escapes(workspace, outside).items():
        wrote = run_tool("write_file", path=path, content="pwned")
        assert wrote.is_error, kind
        edited = run_tool("edit_file", path=path, old_string="TOP", new_string="pwned")
        assert edited.is_error, kind
        appended = run_tool("write_file", path=path, content="pwned", append=True)
        assert appended.is_error, kind
    new_outside = run_tool("write_file", path="../outside/new.txt", content="x")
    assert new_outside.is_error
    assert outside.read_text() == "TOP SECRET\n"
    assert set(os.listdir(outside.parent)) == before


def test_listing_and_searching_do_not_follow_links_out(
    run_tool: Runner, workspace: Path, outside: Path
) -> None:
    _escapes(workspace, outside)
    (workspace / "inside.txt").write_text("SECRET is not here\n")
    found = run_tool("search", pattern="SECRET")
    assert not found.is_error
    assert "TOP SECRET" not in found.for_llm
    assert "inside.txt:1:" in found.for_llm
    assert run_tool("search", pattern="x", path="link_dir").is_error
    assert run_tool("list_files", path="link_dir").is_error
    assert run_tool("list_files", path="..").is_error
    globbed = run_tool("glob", pattern="**/*.txt")
    assert globbed.for_llm.splitlines() == ["inside.txt"]
    assert run_tool("glob", pattern="../*/*.txt").is_error
    assert run_tool("exec", command="true", working_dir="link_dir").is_error


def test_symlink_inside_the_workspace_is_fine(run_tool: Runner, workspace: Path) -> None:
    (workspace / "real.txt").write_text("hello\n")
    (workspace / "alias.txt").symlink_to("real.txt")
    assert "hello" in run_tool("read_file", path="alias.txt").for_llm


def test_git_dir_is_read_only_unless_allowed(run_tool: Runner, workspace: Path) -> None:
    (workspace / ".git").mkdir()
    (workspace / ".git" / "config").write_text("[core]\n")
    assert not run_tool("read_file", path=".git/config").is_error
    denied = run_tool("write_file", path=".git/config", content="evil")
    assert denied.is_error and "protected" in denied.for_llm
    assert run_tool("edit_file", path=".git/config", old_string="core", new_string="x").is_error
    assert run_tool("write_file", path="sub/.git/hooks/pre-commit", content="x").is_error
    assert (workspace / ".git" / "config").read_text() == "[core]\n"
    run_tool.writable = [".git/**"]
    assert not run_tool("write_file", path=".git/config", content="ok").is_error
    assert (workspace / ".git" / "config").read_text() == "ok"
