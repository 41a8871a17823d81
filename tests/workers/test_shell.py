"""Shell lines as the commands they run (tree-sitter-bash)."""

from __future__ import annotations

import pytest

from workers.shell import command_pattern, parse_shell


@pytest.mark.parametrize(
    ("line", "commands"),
    [
        ("git status", ["git status"]),
        ("git status && rm -rf ~", ["git status", "rm -rf ~"]),
        ("a || b; c | d", ["a", "b", "c", "d"]),
        ("(cd x && make)", ["cd x", "make"]),
        ("echo $(whoami) `id`", ["echo $(whoami) `id`", "whoami", "id"]),
        ("diff <(ls a) <(ls b)", ["diff <(ls a) <(ls b)", "ls a", "ls b"]),
        ("cat <<EOF\n$(curl x)\nEOF\n", ["cat", "curl x"]),
        ("bash -c 'rm -rf /; ls'", ["bash -c rm -rf /; ls", "rm -rf /", "ls"]),
        ("sh -lc \"sh -c 'reboot'\"", ["sh -lc sh -c 'reboot'", "sh -c reboot", "reboot"]),
        (
            "env -i FOO=1 sh -c 'curl x | sh'",
            ["env -i FOO=1 sh -c curl x | sh", "sh -c curl x | sh", "curl x", "sh"],
        ),
        (
            "sudo -u root timeout 5 rm -Rf /",
            ["sudo -u root timeout 5 rm -Rf /", "timeout 5 rm -Rf /", "rm -Rf /"],
        ),
        ("find . | xargs -n1 rm", ["find .", "xargs -n1 rm", "rm"]),
        ("git 'sta'tus", ["git status"]),
        ("r\\m -rf /", ["rm -rf /"]),
    ],
)
def test_every_command_of_a_line_is_found(line: str, commands: list[str]) -> None:
    parsed = parse_shell(line)
    assert parsed.ok, parsed.error
    assert [c.text for c in parsed.commands] == commands


def test_wrappers_redirects_assignments_and_computed_names() -> None:
    parsed = parse_shell("FOO=1 ls > out.txt 2>/dev/null; $CMD x; nohup make")
    ls, computed, nohup, make = parsed.commands
    assert ls.assignments == ("FOO=1",) and ls.writes_to == ("out.txt",)
    assert computed.dynamic_name and not ls.dynamic_name
    assert nohup.wrapper and not make.wrapper


@pytest.mark.parametrize("line", ["echo 'unterminated", "if then fi (", "x" * 10_001])
def test_lines_that_cannot_be_judged_say_so(line: str) -> None:
    parsed = parse_shell(line)
    assert not parsed.ok and parsed.error and parsed.commands == []


@pytest.mark.parametrize(
    ("spec", "text", "matches"),
    [
        ("git status", "git status", True),
        ("git status", "git status -s", False),
        ("git status *", "git status", True),
        ("git status *", "git status --short", True),
        ("git status *", "git statusx", False),
        ("npm run test:*", "npm run test", True),
        ("npm run test:*", "npm run test --watch", True),
        ("npm run test:*", "npm run testing", False),
        ("npm run *", "npm run build", True),
        ("* --version", "python --version", True),
        ("docker   ps", "docker ps", True),
    ],
)
def test_command_patterns(spec: str, text: str, matches: bool) -> None:
    assert bool(command_pattern(spec).fullmatch(text)) is matches
