"""Shell commands as a list of simple commands, parsed with tree-sitter-bash.

Permission rules and safety checks judge every command a shell line would run: each
part of a list or pipeline, subshells, command and process substitutions, heredoc and
herestring scripts, the script given to `sh -c` / `eval` (recursively), what wrappers
(`env`, `xargs`, `busybox`, `find -exec`, …) run, with ANSI-C quoting and brace
expansion undone. Each command knows the directory it runs in after the line's `cd`s,
so a relative path can be judged where it really points. A line that does not parse, or
is too long, is reported as such, so callers can fail closed.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
from dataclasses import dataclass, field, replace
from functools import cache, lru_cache

import bracex
from tree_sitter import Language, Node, Parser

MAX_COMMAND_CHARS = 10_000
MAX_NESTING = 5
MAX_BRACE_WORDS = 64
SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "ash", "mksh", "yash", "fish"})
SOURCES = frozenset({"source", "."})
STDIN_FILES = frozenset({"/dev/stdin", "/dev/fd/0", "/proc/self/fd/0", "-"})
CD_COMMANDS = frozenset({"cd", "pushd", "popd"})
OUTPUT_REDIRECTS = frozenset({">", ">>", "&>", "&>>", ">|", ">&", "<>"})
INPUT_REDIRECTS = frozenset({"<", "<&", "<>"})
DYNAMIC_NODES = frozenset(
    {
        "command_substitution",
        "process_substitution",
        "simple_expansion",
        "expansion",
        "arithmetic_expansion",
    }
)
# a new shell runs these: a `cd` inside them does not move the commands after them
SUBSHELL_NODES = frozenset({"subshell", "command_substitution", "process_substitution"})

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


@dataclass
class _Cwd:
    """The directory the next command runs in, moved by `cd`, `pushd` and `popd`."""

    base: str = "."
    stack: list[str] = field(default_factory=list)

    def copy(self) -> _Cwd:
        return _Cwd(self.base, list(self.stack))

    def change(self, command: SimpleCommand) -> None:
        operands = [a for a in command.argv[1:] if not a.startswith("-") or a == "-"]
        if command.name == "popd":
            self.base = self.stack.pop() if self.stack else "$"
            return
        if command.name == "pushd":
            self.stack.append(self.base)
            if operands and operands[0].startswith("+"):  # rotates the stack
                operands = ["$"]
        target = operands[0] if operands else "~"
        self.base = "$" if target == "-" else resolve(self.base, target)


@cache
def _parser() -> Parser:
    import tree_sitter_bash

    return Parser(Language(tree_sitter_bash.language()))


@lru_cache(maxsize=512)
def parse_shell(source: str, base: str = ".") -> ParsedShell:
    """Every simple command in `source`, outermost first, in source order; `base` is the
    exec's working dir, relative to the workspace."""
    if len(source) > MAX_COMMAND_CHARS:
        return ParsedShell(error=f"command longer than {MAX_COMMAND_CHARS} characters")
    result = ParsedShell()
    _collect(source, result, 0, _Cwd(posixpath.normpath(base or ".")))
    if result.error:
        expanded = _brace_expanded(source)  # `{rm,-rf,/}` does not parse, its expansion does
        if expanded is not None:
            retry = ParsedShell()
            _collect(expanded, retry, 0, _Cwd(posixpath.normpath(base or ".")))
            if retry.ok:
                return retry
    return result


def _collect(source: str, result: ParsedShell, depth: int, cwd: _Cwd) -> None:
    data = source.encode()
    tree = _parser().parse(data)
    if tree.root_node.has_error:
        result.error = "the command does not parse as shell"
        return
    _walk(tree.root_node, data, result, depth, (), cwd)


def _walk(
    node: Node,
    data: bytes,
    result: ParsedShell,
    depth: int,
    writes: tuple[str, ...],
    cwd: _Cwd,
) -> None:
    if node.type in SUBSHELL_NODES:
        cwd = cwd.copy()
    if node.type == "redirected_statement":
        targets = writes + _redirect_targets(node, data, OUTPUT_REDIRECTS)
        first = len(result.commands)
        redirects = ("file_redirect", "heredoc_redirect", "herestring_redirect")
        if not any(c.type not in redirects for c in node.children):  # `> file` alone
            result.commands.append(SimpleCommand((":",), writes_to=targets, cwd=cwd.base))
        owner = first
        for child in node.children:
            if child.type not in redirects:
                owner = _walk_redirected(child, data, result, depth, writes, targets, cwd)
            else:
                _walk(child, data, result, depth, writes, cwd)  # substitutions inside redirects
        if reads := _redirect_targets(node, data, INPUT_REDIRECTS):
            for i in range(owner, len(result.commands)):
                result.commands[i] = replace(result.commands[i], reads_from=reads)
        body = next(
            (
                b
                for c in node.children
                if c.type == "heredoc_redirect"
                for b in c.children
                if b.type == "heredoc_body"
            ),
            None,
        )
        if body is not None and owner < len(result.commands):
            _stdin_script(result.commands[owner], _text(body, data), result, depth, cwd)
        return
    if node.type == "pipeline":
        _walk_pipeline(node, data, result, depth, writes, writes, cwd)
        return
    if node.type == "function_definition":
        name_node = node.child_by_field_name("name")
        start = len(result.commands)
        for child in node.children:
            _walk(child, data, result, depth, writes, cwd)
        if name_node is not None:
            name = _text(name_node, data)
            calls = sum(1 for c in result.commands[start:] if c.argv[:1] == (name,))
            result.self_calls[name] = calls
        return
    if node.type == "command":
        command = _simple_command(node, data, writes, cwd.base)
        first = len(result.commands)
        result.commands.append(command)
        _look_through(command, result, depth, cwd)
        for c in result.commands[first:]:
            if c.name in CD_COMMANDS and not c.wrapper:
                cwd.change(c)
        herestring = next((c for c in node.children if c.type == "herestring_redirect"), None)
        if herestring is not None and herestring.children[1:]:
            script = _word(herestring.children[-1], data)[0]
            _stdin_script(command, script, result, depth, cwd)
    for child in node.children:
        _walk(child, data, result, depth, writes if node.type != "command" else (), cwd)


def _walk_redirected(
    node: Node,
    data: bytes,
    result: ParsedShell,
    depth: int,
    writes: tuple[str, ...],
    targets: tuple[str, ...],
    cwd: _Cwd,
) -> int:
    """Walk what a redirect applies to; returns where its commands start in `result`.
    tree-sitter-bash hangs `a && b > f` and `a | b > f` on the whole list or pipeline,
    but bash gives the redirect to `b` alone: only the last part gets the targets."""
    if node.type == "list":
        parts = [c for c in node.children if c.is_named]
        for part in parts[:-1]:
            _walk(part, data, result, depth, writes, cwd)
        return _walk_redirected(parts[-1], data, result, depth, writes, targets, cwd)
    if node.type == "pipeline":
        return _walk_pipeline(node, data, result, depth, writes, targets, cwd)
    start = len(result.commands)
    _walk(node, data, result, depth, targets, cwd)
    return start


def _walk_pipeline(
    node: Node,
    data: bytes,
    result: ParsedShell,
    depth: int,
    writes: tuple[str, ...],
    last_writes: tuple[str, ...],
    cwd: _Cwd,
) -> int:
    """Each stage runs in a subshell of its own; returns where the last stage starts."""
    stages: list[list[int]] = []
    parts = [c for c in node.children if c.type not in ("|", "|&")]
    start = len(result.commands)
    for index, child in enumerate(parts):
        start = len(result.commands)
        last = index == len(parts) - 1
        if last and last_writes is not writes:
            _walk_redirected(child, data, result, depth, writes, last_writes, cwd.copy())
        else:
            _walk(child, data, result, depth, writes, cwd.copy())
        stages.append(list(range(start, len(result.commands))))
    result.pipelines.append(stages)
    return start


def _stdin_script(
    fed: SimpleCommand, script: str, result: ParsedShell, depth: int, cwd: _Cwd
) -> None:
    """`sh <<EOF … EOF`, `bash <<< '…'`, `. /dev/stdin <<< '…'`: a script the shell runs."""
    runs_stdin = (fed.name in SHELLS and _shell_script(fed) is None) or (
        fed.name in SOURCES and any(a in STDIN_FILES for a in fed.argv[1:])
    )
    if runs_stdin and depth < MAX_NESTING:
        _collect(script, result, depth + 1, cwd.copy() if fed.name in SHELLS else cwd)


def _redirect_targets(node: Node, data: bytes, operators: frozenset[str]) -> tuple[str, ...]:
    """Files a statement's redirects with these operators name (not fds, not /dev/null)."""
    targets = []
    for child in node.children:
        if child.type != "file_redirect":
            continue
        parts = child.children
        at = next((i for i, c in enumerate(parts) if c.type in operators), None)
        if at is None or at + 1 >= len(parts):
            continue
        destination = parts[at + 1]  # what follows the operator (`0>&1` may trail it)
        if destination.type == "file_descriptor":
            continue
        target = _word(destination, data)[0]
        if target != "/dev/null" and not target.isdigit() and not target.startswith("&"):
            targets.append(target)
    return tuple(targets)


def _simple_command(node: Node, data: bytes, writes: tuple[str, ...], cwd: str) -> SimpleCommand:
    argv: list[str] = []
    assignments: list[str] = []
    dynamic_name = False
    for child in node.children:
        if child.type == "variable_assignment":
            assignments.append(_text(child, data))
        elif child.type == "command_name":
            word_node = child.children[0] if child.children else child
            words = _expanded(word_node, data)
            argv += words
            dynamic_name = _has_dynamic(word_node)
        elif child.type in ("file_redirect", "herestring_redirect", "heredoc_redirect"):
            continue
        else:
            argv += _expanded(child, data)
    return SimpleCommand(
        tuple(argv), tuple(assignments), writes_to=writes, dynamic_name=dynamic_name, cwd=cwd
    )


def _expanded(node: Node, data: bytes) -> list[str]:
    """A word's values: one, or several when an unquoted brace expansion makes more."""
    word, dynamic = _word(node, data)
    if dynamic or node.type not in ("word", "concatenation") or "{" not in word:
        return [word]
    raw = _text(node, data)
    if any(q in raw for q in "'\"\\"):
        return [word]  # quoted braces are literal
    try:
        return bracex.expand(raw, limit=MAX_BRACE_WORDS) or [word]
    except (bracex.ExpansionLimitException, ValueError):
        return ["$" + word]  # too many to judge: as unknown as a computed word


def _brace_expanded(source: str) -> str | None:
    """The line with each unquoted brace word expanded, or None when nothing changes."""
    if "{" not in source or "," not in source:
        return None
    try:
        words = shlex.split(source, posix=True)
        out = [w for word in words for w in bracex.expand(word, limit=MAX_BRACE_WORDS)]
    except (ValueError, bracex.ExpansionLimitException):
        return None
    return shlex.join(out) if out != words else None


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


def _look_through(command: SimpleCommand, result: ParsedShell, depth: int, cwd: _Cwd) -> None:
    """What a command runs is a command of this line too: wrappers, `sh -c 'script'`,
    `eval 'literal'` and `find -exec` (the last command in `result` is `command`)."""
    if depth >= MAX_NESTING:
        return
    inner = unwrap(command.argv)
    if inner is not None:
        result.commands[-1] = replace(command, wrapper=True)
        feeds = command.name in ARGUMENT_FEEDERS
        if command.name == "parallel" and ":::" in inner:  # explicit arguments follow `:::`
            at = inner.index(":::")
            inner, feeds = inner[:at] + tuple(a for a in inner[at + 1 :] if a != ":::"), False
        wrapped = SimpleCommand(
            inner,
            writes_to=command.writes_to,
            reads_from=command.reads_from,
            dynamic_name=command.dynamic_name,
            cwd=command.cwd,
            stdin_args=command.stdin_args or feeds,
        )
        result.commands.append(wrapped)
        _look_through(wrapped, result, depth + 1, cwd)
        return
    if command.name == "find":
        for action in find_parts(command.argv)[2]:
            result.commands.append(SimpleCommand(action, cwd=command.cwd))
            _look_through(result.commands[-1], result, depth + 1, cwd)
        return
    script = _shell_script(command)
    if script is None and command.name == "eval" and not _computed(command.argv[1:]):
        script = " ".join(command.argv[1:]) or None
    if script is not None:
        result.commands[-1] = replace(command, wrapper=True)
        # `sh -c` is a new shell; `eval` runs in this one, so its `cd`s stay
        _collect(script, result, depth + 1, cwd if command.name == "eval" else cwd.copy())


def _computed(words: tuple[str, ...]) -> bool:
    return any("$" in w or "`" in w for w in words)


def _shell_script(command: SimpleCommand) -> str | None:
    if command.name not in SHELLS:
        return None
    args = command.argv[1:]
    for index, arg in enumerate(args):
        if arg.startswith("-") and not arg.startswith("--") and "c" in arg[1:]:
            return args[index + 1] if index + 1 < len(args) else None
    return None


def _text(node: Node, data: bytes) -> str:
    return data[node.start_byte : node.end_byte].decode(errors="replace")


def _has_dynamic(node: Node) -> bool:
    return node.type in DYNAMIC_NODES or any(_has_dynamic(c) for c in node.children)


def _word(node: Node, data: bytes) -> tuple[str, bool]:
    """A word's value with static quoting removed, and whether it is computed."""
    dynamic = _has_dynamic(node)
    if dynamic:
        return _text(node, data), True
    if node.type == "raw_string":
        return _text(node, data)[1:-1], False
    if node.type == "ansi_c_string":
        return ansi_c(_text(node, data)[2:-1]), False
    if node.type in ("string", "translated_string"):
        inner = "".join(_text(c, data) for c in node.children if c.type == "string_content")
        return inner, False
    if node.type == "concatenation":
        return "".join(_word(c, data)[0] for c in node.children), False
    if node.type == "word":
        return _unescape(_text(node, data)), False
    return _text(node, data), False


def _unescape(word: str) -> str:
    out = []
    chars = iter(word)
    for ch in chars:
        out.append(next(chars, "") if ch == "\\" else ch)
    return "".join(out)


_ANSI_C = re.compile(
    r"\\(?:x([0-9A-Fa-f]{1,2})|u([0-9A-Fa-f]{1,4})|U([0-9A-Fa-f]{1,8})|([0-7]{1,3})|c(.)|(.))",
    re.S,
)
_ANSI_C_SIMPLE = {
    "a": "\a",
    "b": "\b",
    "e": "\x1b",
    "E": "\x1b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
}


def ansi_c(body: str) -> str:
    """The value of bash's `$'…'` quoting (`$'\\x72m'` is `rm`)."""

    def one(m: re.Match[str]) -> str:
        hex2, hex4, hex8, octal, ctrl, other = m.groups()
        if hex2 or hex4 or hex8:
            return chr(int(hex2 or hex4 or hex8, 16) % 0x110000)
        if octal:
            return chr(int(octal, 8) & 0xFF)
        if ctrl:
            return chr(ord(ctrl) & 0x1F)
        return _ANSI_C_SIMPLE.get(other, other)

    return _ANSI_C.sub(one, body)
