"""Shell commands as a list of simple commands, parsed with tree-sitter-bash.

Permission rules and safety checks judge every command a shell line would run: each
part of a list or pipeline, subshells, command and process substitutions, heredoc bodies,
and the script given to `sh -c` / `bash -c` (recursively). A line that does not parse, or
is too long, is reported as such, so callers can fail closed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from functools import cache, lru_cache

from tree_sitter import Language, Node, Parser

MAX_COMMAND_CHARS = 10_000
MAX_NESTING = 5
SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "ash"})
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
    "chrt": frozenset(),
    "taskset": frozenset(),
}
POSITIONAL_BEFORE_COMMAND = {"timeout": 1, "chrt": 1, "taskset": 1}


@dataclass(frozen=True)
class SimpleCommand:
    """One command a shell line runs."""

    argv: tuple[str, ...]  # words with static quoting removed; expansions kept as written
    assignments: tuple[str, ...] = ()  # FOO=bar before the command name
    writes_to: tuple[str, ...] = ()  # files its output is redirected to (not /dev/null)
    reads_from: tuple[str, ...] = ()  # files its input is redirected from
    dynamic_name: bool = False  # the command name itself is computed ($CMD, $(...))
    wrapper: bool = False  # runs another listed command (env …, sudo …, sh -c '…')

    @property
    def name(self) -> str:
        return os.path.basename(self.argv[0]) if self.argv else ""

    @property
    def text(self) -> str:
        return " ".join(self.argv)


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


@cache
def _parser() -> Parser:
    import tree_sitter_bash

    return Parser(Language(tree_sitter_bash.language()))


@lru_cache(maxsize=512)
def parse_shell(source: str) -> ParsedShell:
    """Every simple command in `source`, outermost first, in source order."""
    if len(source) > MAX_COMMAND_CHARS:
        return ParsedShell(error=f"command longer than {MAX_COMMAND_CHARS} characters")
    result = ParsedShell()
    _collect(source, result, depth=0)
    return result


def _collect(source: str, result: ParsedShell, depth: int) -> None:
    data = source.encode()
    tree = _parser().parse(data)
    if tree.root_node.has_error:
        result.error = "the command does not parse as shell"
        return
    _walk(tree.root_node, data, result, depth, writes=())


def _walk(
    node: Node, data: bytes, result: ParsedShell, depth: int, writes: tuple[str, ...]
) -> None:
    if node.type == "redirected_statement":
        targets = writes + _redirect_targets(node, data, OUTPUT_REDIRECTS)
        first = len(result.commands)
        for child in node.children:
            if child.type not in ("file_redirect", "heredoc_redirect", "herestring_redirect"):
                _walk(child, data, result, depth, targets)
            else:
                _walk(child, data, result, depth, writes)  # substitutions inside redirects
        if reads := _redirect_targets(node, data, INPUT_REDIRECTS):
            for i in range(first, len(result.commands)):
                result.commands[i] = replace(result.commands[i], reads_from=reads)
        _heredoc_script(node, data, result, depth, first)
        return
    if node.type == "pipeline":
        stages = []
        for child in node.children:
            if child.type in ("|", "|&"):
                continue
            start = len(result.commands)
            _walk(child, data, result, depth, writes)
            stages.append(list(range(start, len(result.commands))))
        result.pipelines.append(stages)
        return
    if node.type == "function_definition":
        name_node = node.child_by_field_name("name")
        start = len(result.commands)
        for child in node.children:
            _walk(child, data, result, depth, writes)
        if name_node is not None:
            name = _text(name_node, data)
            calls = sum(1 for c in result.commands[start:] if c.argv[:1] == (name,))
            result.self_calls[name] = calls
        return
    if node.type == "command":
        command = _simple_command(node, data, writes)
        result.commands.append(command)
        _look_through_shell(command, result, depth)
    for child in node.children:
        _walk(child, data, result, depth, writes if node.type != "command" else ())


def _heredoc_script(node: Node, data: bytes, result: ParsedShell, depth: int, first: int) -> None:
    """`sh <<EOF … EOF`: the heredoc body is a script the shell runs."""
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
    fed = result.commands[first] if first < len(result.commands) else None
    runs_body = fed is not None and fed.name in SHELLS and _shell_script(fed) is None
    if body is not None and runs_body and depth < MAX_NESTING:
        _collect(_text(body, data), result, depth + 1)


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


def _simple_command(node: Node, data: bytes, writes: tuple[str, ...]) -> SimpleCommand:
    argv: list[str] = []
    assignments: list[str] = []
    dynamic_name = False
    for child in node.children:
        if child.type == "variable_assignment":
            assignments.append(_text(child, data))
        elif child.type == "command_name":
            word, dynamic = _word(child.children[0] if child.children else child, data)
            argv.append(word)
            dynamic_name = dynamic
        elif child.type in ("file_redirect", "herestring_redirect", "heredoc_redirect"):
            continue
        else:
            argv.append(_word(child, data)[0])
    return SimpleCommand(
        tuple(argv), tuple(assignments), writes_to=writes, dynamic_name=dynamic_name
    )


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


def _look_through_shell(command: SimpleCommand, result: ParsedShell, depth: int) -> None:
    """Wrappers and `sh -c 'script'`: what they run is a command of this line too, and the
    wrapper is marked as such (the last command in `result` is `command`)."""
    if depth >= MAX_NESTING:
        return
    inner = unwrap(command.argv)
    if inner is not None:
        result.commands[-1] = replace(command, wrapper=True)
        wrapped = SimpleCommand(
            inner,
            writes_to=command.writes_to,
            reads_from=command.reads_from,
            dynamic_name=command.dynamic_name,
        )
        result.commands.append(wrapped)
        _look_through_shell(wrapped, result, depth + 1)
        return
    script = _shell_script(command)
    if script is not None:
        result.commands[-1] = replace(command, wrapper=True)
        _collect(script, result, depth + 1)


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
