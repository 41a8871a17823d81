from __future__ import annotations

from pathlib import Path

from broker.config.settings import Settings
from tests.workers.conftest import Runner


def test_write_then_read_numbers_lines(run_tool: Runner, workspace: Path) -> None:
    assert not run_tool("write_file", path="a/b.txt", content="one\ntwo\nthree\n").is_error
    result = run_tool("read_file", path="a/b.txt")
    assert result.for_llm.splitlines() == ["     1\tone", "     2\ttwo", "     3\tthree"]
    appended = run_tool("write_file", path="a/b.txt", content="four\n", append=True)
    assert "appended" in appended.for_llm
    assert (workspace / "a/b.txt").read_text() == "one\ntwo\nthree\nfour\n"


def test_a_shorter_write_replaces_the_whole_file(run_tool: Runner, workspace: Path) -> None:
    """The new content is written over the old bytes, then the file is cut to its length:
    no tail of the old content is left, and an empty write empties the file."""
    (workspace / "f.txt").write_text("a much longer first version\n" * 3)
    assert not run_tool("write_file", path="f.txt", content="short\n").is_error
    assert (workspace / "f.txt").read_text() == "short\n"
    assert not run_tool("write_file", path="f.txt", content="").is_error
    assert (workspace / "f.txt").read_bytes() == b""
    edited = run_tool("edit_file", path="a.txt", old_string="x", new_string="y")
    assert edited.is_error  # (no such file: nothing written)
    (workspace / "e.txt").write_text("keep this, drop a long tail\n")
    run_tool("edit_file", path="e.txt", old_string=", drop a long tail", new_string="")
    assert (workspace / "e.txt").read_text() == "keep this\n"


def test_read_pages_with_offset_limit_and_footer(run_tool: Runner, workspace: Path) -> None:
    (workspace / "big.txt").write_text("".join(f"line {i}\n" for i in range(1, 101)))
    page = run_tool("read_file", path="big.txt", offset=10, limit=5)
    lines = page.for_llm.splitlines()
    assert lines[0] == "    10\tline 10" and lines[4] == "    14\tline 14"
    assert lines[-1] == "[showed lines 10-14 of 100; read on with offset=15]"
    assert run_tool("read_file", path="big.txt", offset=101).is_error


def test_read_size_cap_says_how_to_read_on(workspace: Path) -> None:
    runner = Runner(workspace, Settings(read_max_bytes=1024))
    (workspace / "wide.txt").write_text("".join(f"{i:04d} " + "x" * 90 + "\n" for i in range(100)))
    result = runner("read_file", path="wide.txt")
    assert len(result.for_llm) < 1400
    footer = result.for_llm.splitlines()[-1]
    assert "page cap" in footer and "offset=" in footer
    next_offset = int(footer.rsplit("offset=", 1)[1].rstrip("]"))
    again = runner("read_file", path="wide.txt", offset=next_offset)
    assert again.for_llm.startswith(f"{next_offset:>6}\t")


def test_read_rejects_binary_and_missing(run_tool: Runner, workspace: Path) -> None:
    (workspace / "bin").write_bytes(b"\x00\x01\x02")
    assert "binary" in run_tool("read_file", path="bin").for_llm
    assert "does not exist" in run_tool("read_file", path="nope.txt").for_llm


def test_edit_must_match_exactly_once(run_tool: Runner, workspace: Path) -> None:
    (workspace / "f.py").write_text("x = 1\ny = 1\n")
    twice = run_tool("edit_file", path="f.py", old_string="= 1", new_string="= 2")
    assert twice.is_error and "2 times" in twice.for_llm
    assert run_tool("edit_file", path="f.py", old_string="z", new_string="w").is_error
    assert (workspace / "f.py").read_text() == "x = 1\ny = 1\n"
    once = run_tool("edit_file", path="f.py", old_string="x = 1", new_string="x = 3")
    assert not once.is_error
    every = run_tool("edit_file", path="f.py", old_string="= ", new_string="== ", replace_all=True)
    assert every.metadata["replacements"] == 2
    assert (workspace / "f.py").read_text() == "x == 3\ny == 1\n"


def test_edit_rejects_empty_and_identical_strings(run_tool: Runner, workspace: Path) -> None:
    (workspace / "f.txt").write_text("abc")
    empty = run_tool("edit_file", path="f.txt", old_string="", new_string="x")
    assert empty.is_error and "empty" in empty.for_llm
    same = run_tool("edit_file", path="f.txt", old_string="a", new_string="a")
    assert same.is_error and "identical" in same.for_llm


def test_list_search_glob(run_tool: Runner, workspace: Path) -> None:
    (workspace / "src").mkdir()
    (workspace / "src" / "app.py").write_text("import os\n\ndef main():\n    return os.name\n")
    (workspace / "README.md").write_text("# app\nrun main\n")
    (workspace / ".git").mkdir()
    (workspace / ".git" / "HEAD").write_text("main\n")
    assert run_tool("list_files").for_llm.splitlines() == [".git/", "README.md", "src/"]
    found = run_tool("search", pattern=r"main\(?", include="*.py").for_llm.splitlines()
    assert found == ["src/app.py:3: def main():"]
    everywhere = run_tool("search", pattern="MAIN", ignore_case=True).for_llm
    assert "README.md:2: run main" in everywhere and ".git" not in everywhere
    assert run_tool("glob", pattern="**/*.py").for_llm == "src/app.py"
    assert run_tool("glob", pattern="*.md").for_llm == "README.md"
    assert "invalid regular expression" in run_tool("search", pattern="(").for_llm


def test_search_caps_results(workspace: Path) -> None:
    runner = Runner(workspace, Settings(search_max_results=3))
    (workspace / "many.txt").write_text("hit\n" * 10)
    lines = runner("search", pattern="hit").for_llm.splitlines()
    assert lines[:3] == ["many.txt:1: hit", "many.txt:2: hit", "many.txt:3: hit"]
    assert lines[3] == "[7 more matches not shown; narrow the pattern or path]"
