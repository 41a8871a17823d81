"""What a shell line's commands are: one simple command (its words, where it runs, what it
writes and reads), a parsed line, and what a command runs in its turn (wrappers, `find
-exec`, `sh -c`). The parser that makes them is `shell.py`."""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass, field

SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "ash", "mksh", "yash", "fish"})


SOURCES = frozenset({"source", "."})


STDIN_FILES = frozenset({"/dev/stdin", "/dev/fd/0", "/proc/self/fd/0", "-"})


CD_COMMANDS = frozenset({"cd", "pushd", "popd"})


OUTPUT_REDIRECTS = frozenset({">", ">>", "&>", "&>>", ">|", ">&", "<>"})


INPUT_REDIRECTS = frozenset({"<", "<&", "<>"})


# wrapper → its options that take a value; what follows the options is the wrapped command
WRAPPERS: dict[str, frozenset[str]] = {
    "env": frozenset({"-u", "--unset", "-C", "--chdir", "-S", "--split-string"}),
    "sudo": frozenset({"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "--user"}),
    "doas": frozenset({"-u", "-C"}),
    "timeout": frozenset({"-s", "--signal", "-k", "--kill-after"}),
    "nice": frozenset({"-n", "--adjustment"}),
    "ionice": frozenset({"-c", "-n", "-p"}),
    "nohup": frozenset(),
    "setsid": frozenset(),
    "command": frozenset(),
    "builtin": frozenset(),
    "exec": frozenset({"-a"}),
    "time": frozenset({"-f", "-o"}),
    "stdbuf": frozenset({"-i", "-o", "-e"}),
    "xargs": frozenset(
        {
            "-a",
            "-d",
            "-E",
            "-I",
            "-L",
            "-n",
            "-P",
            "-s",
            "--max-args",
            "--max-procs",
            "--delimiter",
            "--replace",
            "--arg-file",
        }
    ),
    "parallel": frozenset(
        {"-j", "--jobs", "-S", "-a", "--arg-file", "-I", "-d", "--delimiter", "-N", "-n"}
    ),
    "chrt": frozenset(),
    "taskset": frozenset(),
    "busybox": frozenset(),  # `busybox rm …` is rm
    "toybox": frozenset(),
    "unbuffer": frozenset(),
    "flock": frozenset({"-w", "--timeout", "-E", "--conflict-exit-code"}),
}


POSITIONAL_BEFORE_COMMAND = {"timeout": 1, "chrt": 1, "taskset": 1, "flock": 1}


# wrappers that hand their command arguments read from stdin (or a file)
ARGUMENT_FEEDERS = frozenset({"xargs", "parallel"})


FIND_ACTIONS = frozenset({"-exec", "-execdir", "-ok", "-okdir"})


@dataclass(frozen=True)
class SimpleCommand:
    """One command a shell line runs."""

    argv: tuple[str, ...]  # words with static quoting removed; expansions kept as written
    assignments: tuple[str, ...] = ()  # FOO=bar before the command name
    writes_to: tuple[str, ...] = ()  # files its output is redirected to (not /dev/null)
    reads_from: tuple[str, ...] = ()  # files its input is redirected from
    dynamic_name: bool = False  # the command name itself is computed ($CMD, $(...))
    wrapper: bool = False  # runs another listed command (env …, sudo …, sh -c '…')
    # where its relative paths start, seen from the exec's working dir: `.` there; a
    # relative or absolute path after a `cd`; `~…` for home; `$…` when it cannot be known
    cwd: str = "."
    stdin_args: bool = False  # more arguments come from stdin or a file (xargs, parallel)

    @property
    def name(self) -> str:
        return os.path.basename(self.argv[0]) if self.argv else ""

    @property
    def text(self) -> str:
        return " ".join(self.argv)

    def resolve(self, path: str) -> str:
        """`path` as seen from the exec's working dir (see `resolve`)."""
        return resolve(self.cwd, path)


def resolve(base: str, path: str) -> str:
    """Where `path` points when the command runs in `base` (both as in `SimpleCommand`)."""
    path = path.strip("\"'")
    if path.startswith(("/", "~", "$")):
        return posixpath.normpath(path) if path.startswith("/") else path
    if base.startswith(("~", "$")):
        return f"{base.rstrip('/')}/{path}"
    return posixpath.normpath(posixpath.join(base, path))


def command_pattern(specifier: str) -> re.Pattern[str]:
    """A rule's command pattern: `*` matches anything; a trailing ` *` (or the older
    `:*`) also matches the bare prefix, so `git status *` covers `git status`."""
    spec = " ".join(specifier.split())
    if spec.endswith(":*"):
        spec = spec[:-2] + " *"
    tail = ""
    if spec.endswith(" *"):
        spec, tail = spec[:-2], "(?: .*)?"
    return re.compile(".*".join(re.escape(part) for part in spec.split("*")) + tail, re.S)


@dataclass
class ParsedShell:
    commands: list[SimpleCommand] = field(default_factory=list)
    error: str = ""  # why the line could not be judged; empty when it parsed
    # each pipeline as its stages, each stage as indices into `commands`
    pipelines: list[list[list[int]]] = field(default_factory=list)
    # functions defined in the line → how many times each body calls the function itself
    self_calls: dict[str, int] = field(default_factory=dict)

    def stage_commands(self, stage: list[int]) -> list[SimpleCommand]:
        return [self.commands[i] for i in stage]

    @property
    def ok(self) -> bool:
        return not self.error


def unwrap(argv: tuple[str, ...]) -> tuple[str, ...] | None:
    """The command a wrapper (`env`, `sudo`, `timeout 5`, `xargs -n1`, …) runs, if any."""
    if not argv:
        return None
    name = os.path.basename(argv[0])
    if name not in WRAPPERS:
        return None
    takes_value = WRAPPERS[name]
    positional = POSITIONAL_BEFORE_COMMAND.get(name, 0)
    index = 1
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            index += 1
            break
        if arg.startswith("-") and len(arg) > 1:
            index += 2 if arg in takes_value else 1
        elif name == "env" and "=" in arg:
            index += 1
        elif positional:
            positional -= 1
            index += 1
        else:
            break
    return argv[index:] or None


def find_parts(argv: tuple[str, ...]) -> tuple[list[str], list[str], list[tuple[str, ...]]]:
    """`find`'s start paths, its expression, and the commands its -exec/-ok actions run."""
    args = list(argv[1:])
    while (args and args[0] in ("-H", "-L", "-P")) or (args and args[0].startswith("-O")):
        args.pop(0)
    split = next(
        (i for i, a in enumerate(args) if a.startswith("-") or a in ("(", "!", ",")), len(args)
    )
    starts, expression = args[:split], args[split:]
    actions: list[tuple[str, ...]] = []
    index = 0
    while index < len(expression):
        if expression[index] in FIND_ACTIONS:
            end = next(
                (
                    j
                    for j in range(index + 1, len(expression))
                    if expression[j] in (";", "\\;", "+")
                ),
                len(expression),
            )
            if end > index + 1:
                actions.append(tuple(expression[index + 1 : end]))
            index = end
        index += 1
    return starts, expression, actions


def is_computed(words: tuple[str, ...]) -> bool:
    return any("$" in w or "`" in w for w in words)


def shell_script(command: SimpleCommand) -> str | None:
    if command.name not in SHELLS:
        return None
    args = command.argv[1:]
    for index, arg in enumerate(args):
        if arg.startswith("-") and not arg.startswith("--") and "c" in arg[1:]:
            return args[index + 1] if index + 1 < len(args) else None
    return None
