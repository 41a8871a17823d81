"""Shell lines as the commands they run (tree-sitter-bash)."""

from __future__ import annotations

import pytest

from workers.confine.shell import parse_shell
from workers.confine.shell_commands import command_pattern


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


def test_a_redirect_after_a_list_or_pipeline_belongs_to_its_last_command() -> None:
    cd, echo = parse_shell("cd sub && echo x > ../f < in").commands
    assert cd.writes_to == () and cd.reads_from == ()
    assert echo.writes_to == ("../f",) and echo.reads_from == ("in",) and echo.cwd == "sub"
    a, b = parse_shell("a | b > f").commands
    assert a.writes_to == () and b.writes_to == ("f",)
    grouped = parse_shell("{ a; b; } > f").commands
    assert [c.writes_to for c in grouped] == [("f",), ("f",)]


def test_cd_moves_later_commands_but_not_out_of_a_subshell() -> None:
    parsed = parse_shell("cd a; (cd b; x); y | (cd c); z; pushd d; w; popd; v")
    where = {c.text: c.cwd for c in parsed.commands}
    assert where == {
        "cd a": ".",
        "cd b": "a",
        "x": "a/b",
        "y": "a",
        "cd c": "a",
        "z": "a",
        "pushd d": "a",
        "w": "a/d",
        "popd": "a/d",
        "v": "a",
    }


def test_ansi_c_quoting_brace_expansion_and_wrappers_are_undone() -> None:
    assert parse_shell("$'\\x72m' -rf $'\\057'").commands[0].argv == ("rm", "-rf", "/")
    assert parse_shell("rm -rf {a,b}/c").commands[0].argv == ("rm", "-rf", "a/c", "b/c")
    assert parse_shell("echo '{a,b}'").commands[0].argv == ("echo", "{a,b}")
    assert [c.text for c in parse_shell("busybox rm x").commands] == ["busybox rm x", "rm x"]
    found = [c.text for c in parse_shell("find . -exec rm {} \\; -ok ls {} +").commands]
    assert found == ["find . -exec rm {} ; -ok ls {} +", "rm {}", "ls {}"]
    assert parse_shell("echo a | xargs rm").commands[-1].stdin_args


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


@pytest.mark.parametrize(
    ("line", "commands"),
    [  # the four, and their kin: each target is where the variable points
        ("f=running/c1; touch $f", ["touch running/c1"]),
        ('for f in *.txt; do mv "$f" "${f%.txt}.md"; done', ["mv *.txt *.md"]),
        (
            'out=build; mkdir -p "$out" && cp src/*.c "$out"/',
            ["mkdir -p build", "cp src/*.c build/"],
        ),
        ('name=report; echo data > "${name}.csv"', ["echo data > report.csv"]),
        ("for d in a b; do rm -rf /$d; done", ["rm -rf /a", "rm -rf /b"]),
        ("export D=x; f=$D/y; touch $f", ["touch x/y"]),
        ("a=1 b=2; touch $a$b", ["touch 12"]),
        ('f=a.tar.gz; touch "${f%%.*}" "${f#*.}" "${g:-dflt}"', ['touch a tar.gz "${g:-dflt}"']),
        ("rm -rf $HOME", ["rm -rf ~"]),
        ('rm -rf "$PWD" "$(pwd)"', ["rm -rf . .", "pwd"]),
        ("c=rm; $c -rf /", ["rm -rf /"]),
        ("f=x; f+=y; touch $f", ["touch xy"]),
    ],
)
def test_variables_the_line_assigns_are_resolved(line: str, commands: list[str]) -> None:
    parsed = parse_shell(line)
    assert parsed.ok, parsed.error
    shown = [c.text + "".join(f" > {t}" for t in c.writes_to) for c in parsed.commands]
    assert shown == commands


@pytest.mark.parametrize(
    ("line", "target"),
    [  # where the line does not say what a variable holds, it stays unresolved
        ("x || f=build && rm -rf $f", "$f"),  # f=build may not have run
        ("f=/; if x; then f=build; else rm -rf $f; fi; rm -rf $f", None),  # / and build
        ('d=build; f(){ rm -rf "$d"; }; d=/; f', '"$d"'),  # a body runs when called
        ("d=$PWD; cd sub; rm -rf $d", "$d"),  # $PWD moves with cd
        ('f="build /"; rm -rf $f', "$f"),  # unquoted, it splits
        ("read f; rm -rf $f", "$f"),
        ("f=build; read f; rm -rf $f", "$f"),
        ("D=x; sh -c 'rm -rf $D'", "$D"),  # not exported: the new shell has none
        ("f=build; for i in 1 2; do f=$f/..; done; rm -rf $f", "$f"),  # a loop's own
        ("f=build; . ./env.sh; rm -rf $f", "$f"),  # a sourced file may set anything
        ("i=build; ((i++)); rm -rf $i", "$i"),  # arithmetic
        ("tmp=$(mktemp -d); rm -rf $tmp", "$tmp"),  # a command's output
    ],
)
def test_what_the_line_does_not_say_stays_unknown(line: str, target: str | None) -> None:
    parsed = parse_shell(line)
    assert parsed.ok, parsed.error
    rms = [c for c in parsed.commands if c.name == "rm"]
    if target is None:
        assert sorted(c.text for c in rms) == ["rm -rf /", "rm -rf /", "rm -rf build"]
    else:
        assert rms[-1].argv[-1] == target
