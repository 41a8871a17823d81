"""Which commands exec may judge harmless: one that only reads may run beside others, and a
redirect an allow rule may cover stays in the working directory."""

from __future__ import annotations

from pathlib import Path

from workers.confine.shell_commands import SimpleCommand

READ_ONLY = frozenset(
    {
        "ls",
        "cat",
        "head",
        "tail",
        "wc",
        "grep",
        "egrep",
        "fgrep",
        "rg",
        "stat",
        "file",
        "du",
        "df",
        "pwd",
        "echo",
        "printf",
        "true",
        "false",
        "sleep",
        "date",
        "whoami",
        "id",
        "uname",
        "printenv",
        "which",
        "type",
        "sort",
        "uniq",
        "cut",
        "tr",
        "diff",
        "cmp",
        "md5sum",
        "sha256sum",
        "basename",
        "dirname",
        "realpath",
        "readlink",
        "jq",
        "tree",
        "nproc",
        "seq",
    }
)
READ_ONLY_GIT = frozenset({"status", "log", "diff", "show", "rev-parse", "ls-files", "blame"})
WRITING_FIND = frozenset({"-delete", "-exec", "-execdir", "-ok", "-okdir", "-fprint", "-fprintf"})


def read_only(command: SimpleCommand) -> bool:
    if command.writes_to or command.dynamic_name or command.assignments:
        return False
    name, args = command.name, command.argv[1:]
    if name == "find":
        return not WRITING_FIND & set(args)
    if name == "sed":
        return not any(a.startswith(("-i", "--in-place")) for a in args)
    if name == "sort":
        return not any(a.startswith(("-o", "--output")) for a in args)
    if name == "git":
        return bool(args) and args[0] in READ_ONLY_GIT
    return name in READ_ONLY


def stays_inside(target: str) -> bool:
    """A redirect a rule may allow: a plain relative path that cannot leave the working
    directory (absolute, home, `..` or computed targets never are)."""
    return not (target.startswith(("/", "~")) or "$" in target or ".." in Path(target).parts)
