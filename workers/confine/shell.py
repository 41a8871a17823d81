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

from workers.confine.shell_vars import (
    MAX_CANDIDATES,
    MOVES_CWD,
    SETTERS,
    Values,
    Vars,
    product,
    strip,
    union,
)

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
class _Scope:
    """What the shell knows before the next command: the directory it runs in (moved by
    `cd`, `pushd` and `popd`) and the variables the line assigned (`workers.confine.shell_vars`)."""

    base: str = "."
    stack: list[str] = field(default_factory=list)
    vars: Vars = field(default_factory=Vars)

    def copy(self) -> _Scope:
        """A subshell's: the same values, and nothing flows back."""
        return _Scope(self.base, list(self.stack), self.vars.copy())

    def child(self) -> _Scope:
        """A new shell's: the same directory, only exported variables."""
        return _Scope(self.base, list(self.stack), self.vars.child())

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
    _collect(source, result, 0, _Scope(posixpath.normpath(base or ".")))
    if result.error:
        expanded = _brace_expanded(source)  # `{rm,-rf,/}` does not parse, its expansion does
        if expanded is not None:
            retry = ParsedShell()
            _collect(expanded, retry, 0, _Scope(posixpath.normpath(base or ".")))
            if retry.ok:
                return retry
    return result


def _collect(source: str, result: ParsedShell, depth: int, cwd: _Scope) -> None:
    data = source.encode()
    tree = _parser().parse(data)
    if tree.root_node.has_error:
        result.error = "the command does not parse as shell"
        return
    _prescan(tree.root_node, data, cwd.vars)
    cwd.vars.moves_cwd |= bool(MOVES_CWD.search(source))
    _walk(tree.root_node, data, result, depth, (), cwd)


ARITHMETIC_NODES = frozenset({"arithmetic_expansion", "c_style_for_statement"})
LOOPS = frozenset({"for_statement", "c_style_for_statement", "while_statement", "until_statement"})


def _prescan(root: Node, data: bytes, vars: Vars) -> None:
    """Names no value can be given for anywhere in the line: set by arithmetic, in a
    function (called who knows when), by `read` and its kind, `declare` with attributes;
    and a `source`d file or computed `eval` makes every variable unknown."""
    stack = [(root, False, False)]
    while stack:
        node, in_function, in_arithmetic = stack.pop()
        kind = node.type
        in_function = in_function or kind == "function_definition"
        in_arithmetic = (
            in_arithmetic
            or kind in ARITHMETIC_NODES
            or (kind == "compound_statement" and _text(node, data).startswith("(("))
        )
        if kind == "variable_name" and in_arithmetic:
            vars.unstable.add(_text(node, data))
        if kind == "variable_assignment" and in_function:
            vars.unstable.add(_assigned_name(node, data))
        if kind == "declaration_command":
            flags = {_text(c, data) for c in node.children if c.type == "word"}
            if flags - {"-x", "-r", "-g", "-rx", "-xr"} or in_function:
                vars.unstable.update(_declared_names(node, data))
        if kind == "command":
            words = [_text(c, data) for c in node.children if c.type in ("word", "command_name")]
            name = os.path.basename(words[0]) if words else ""
            if name in SETTERS:
                vars.unstable.update(w for w in words[1:] if w.isidentifier())
            if name in SOURCES and not any(w in STDIN_FILES for w in words[1:]):
                vars.opaque = True
            if name == "eval" and _has_dynamic(node):
                vars.opaque = True
        stack.extend((c, in_function, in_arithmetic) for c in node.children)


def _assigned_name(node: Node, data: bytes) -> str:
    """The variable a `variable_assignment` sets (an array element: the array)."""
    first = node.children[0] if node.children else node
    if first.type == "subscript" and first.children:
        first = first.children[0]
    return _text(first, data)


def _declared_names(node: Node, data: bytes) -> list[str]:
    return [
        _assigned_name(c, data) if c.type == "variable_assignment" else _text(c, data)
        for c in node.children
        if c.type in ("variable_assignment", "variable_name")
    ]


def _assigned(node: Node, data: bytes) -> set[str]:
    """Every variable a part of the line assigns (a loop's body, a branch)."""
    found: set[str] = set()
    stack = [node]
    while stack:
        at = stack.pop()
        if at.type == "variable_assignment" and (at.parent is None or at.parent.type != "command"):
            found.add(_assigned_name(at, data))
        if at.type == "for_statement":
            name = at.child_by_field_name("variable")
            if name is not None:
                found.add(_text(name, data))
        stack.extend(at.children)
    return found


def _assign(node: Node, data: bytes, cwd: _Scope, export: bool = False) -> None:
    """A statement `name=value` (or `name+=value`): the variable holds the value's
    candidates from here on (a prefix `name=value cmd` is the command's alone)."""
    parts = node.children
    if not parts or parts[0].type != "variable_name":
        if parts:
            cwd.vars.assign(_assigned_name(node, data), None)
        return
    name = _text(parts[0], data)
    operator = parts[1].type if len(parts) > 1 else "="
    value_nodes = parts[2:]
    value: Values = ("",)
    if value_nodes:
        value = _values(value_nodes[0], data, cwd, quoted=True)
    if operator == "+=":
        value = product([cwd.vars.lookup(name, cwd.base), value])
    cwd.vars.assign(name, value, export)


def _walk(
    node: Node,
    data: bytes,
    result: ParsedShell,
    depth: int,
    writes: tuple[str, ...],
    cwd: _Scope,
) -> None:
    if node.type in SUBSHELL_NODES:
        cwd = cwd.copy()
    if node.type == "redirected_statement":
        targets = writes + _redirect_targets(node, data, OUTPUT_REDIRECTS, cwd)
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
        if reads := _redirect_targets(node, data, INPUT_REDIRECTS, cwd):
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
        outer = cwd.vars  # a body runs when called: what the line assigned is unknown there
        cwd.vars = Vars(unstable=outer.unstable, opaque=outer.opaque, moves_cwd=True)
        for child in node.children:
            _walk(child, data, result, depth, writes, cwd)
        cwd.vars = outer
        if name_node is not None:
            name = _text(name_node, data)
            calls = sum(1 for c in result.commands[start:] if c.argv[:1] == (name,))
            result.self_calls[name] = calls
        return
    if node.type in LOOPS:
        _walk_loop(node, data, result, depth, writes, cwd)
        return
    if node.type in ("if_statement", "case_statement"):
        _walk_branches(node, data, result, depth, writes, cwd)
        return
    if node.type == "list":
        _walk_list(node, data, result, depth, writes, cwd, None)
        return
    parent = node.parent
    if node.type == "variable_assignment" and parent is not None and parent.type != "command":
        for child in node.children:
            _walk(child, data, result, depth, writes, cwd)
        export = parent.type == "declaration_command" and (
            _text(parent, data).startswith("export")
            or "-x" in {_text(c, data) for c in parent.children}
        )
        _assign(node, data, cwd, export)
        return
    if node.type == "declaration_command" and _text(node, data).startswith("export"):
        for child in node.children:
            if child.type == "variable_name":
                cwd.vars.exported.add(_text(child, data))
    if node.type == "command":
        first = len(result.commands)
        variants = _simple_commands(node, data, writes, cwd)
        for command in variants:
            start = len(result.commands)
            result.commands.append(command)
            _look_through(command, result, depth, cwd)
            for c in result.commands[start:]:
                if c.name in CD_COMMANDS and not c.wrapper:
                    cwd.change(c)
        if len(variants) > 1 and any(
            c.name in CD_COMMANDS for c in result.commands[first:]
        ):  # one of several directories
            cwd.base = "$"
        herestring = next((c for c in node.children if c.type == "herestring_redirect"), None)
        if herestring is not None and herestring.children[1:]:
            script = _word(herestring.children[-1], data)[0]
            _stdin_script(variants[0], script, result, depth, cwd)
    for child in node.children:
        _walk(child, data, result, depth, writes if node.type != "command" else (), cwd)


def _walk_loop(
    node: Node,
    data: bytes,
    result: ParsedShell,
    depth: int,
    writes: tuple[str, ...],
    cwd: _Scope,
) -> None:
    """A loop's body may run any number of times: what it assigns is unknown when it
    starts (a later round sees an earlier one's) and after it; a `for` variable holds
    each of its words (a glob: the names it matches)."""
    assigned = _assigned(node, data)
    variable = node.child_by_field_name("variable") if node.type == "for_statement" else None
    items: Values = None
    if variable is not None:
        words = [
            c for c in node.children if c.is_named and c.type not in ("variable_name", "do_group")
        ]
        for word in words:  # substitutions in the list run before the loop
            _walk(word, data, result, depth, writes, cwd)
        has_in = any(c.type == "in" for c in node.children)
        items = union(*(_values(w, data, cwd) for w in words)) if has_in else None
    cwd.vars.forget(assigned)
    for child in node.children:
        if variable is not None and child.type != "do_group":
            continue
        if variable is not None:
            cwd.vars.assign(_text(variable, data), items)
        _walk(child, data, result, depth, writes, cwd)
    cwd.vars.forget(assigned)


def _walk_branches(
    node: Node,
    data: bytes,
    result: ParsedShell,
    depth: int,
    writes: tuple[str, ...],
    cwd: _Scope,
) -> None:
    """`if` and `case`: one branch runs, or none; each starts from what held before it,
    and after them a variable holds what any of them left (`workers.confine.shell_vars.merge`)."""
    branches: list[list[Node]] = [[]]
    heads: list[Node] = []
    in_head = True
    for child in node.children:
        kind = child.type
        if node.type == "if_statement" and kind == "then":
            in_head = False
        elif kind in ("elif_clause", "else_clause", "case_item"):
            branches.append([child])
        elif (in_head and node.type == "if_statement") or (
            node.type == "case_statement" and not branches[-1] and kind != "case_item"
        ):
            heads.append(child)
        elif kind not in ("fi", "esac"):
            branches[-1].append(child)
    for head in heads:  # the condition, the case word: they always run
        _walk(head, data, result, depth, writes, cwd)
    before = cwd.vars
    ends = [] if any(c.type == "else_clause" for c in node.children) else [before.copy()]
    for branch in branches:
        if not branch:
            continue
        cwd.vars = before.copy()
        for child in branch:
            _walk(child, data, result, depth, writes, cwd)
        ends.append(cwd.vars)
    cwd.vars = before
    before.merge(before.copy(), ends, cwd.base)


def _walk_list(
    node: Node,
    data: bytes,
    result: ParsedShell,
    depth: int,
    writes: tuple[str, ...],
    cwd: _Scope,
    targets: tuple[str, ...] | None,
) -> int:
    """`a && b || c`: each part after the first may not run. Along `&&` alone the parts
    run in order, so an assignment holds for the parts after it; after the list it holds
    what it held before or after. With `||`, a later part may run without an earlier
    one, so what the later parts assign is unknown in them and after. `targets`: a
    redirect of the whole list, which bash gives its last part (see `_walk_redirected`).
    Returns where the last part's commands start."""
    parts, operators = _flatten_list(node)
    later = set().union(*(_assigned(p, data) for p in parts[1:]))
    alternatives = "||" in operators
    before = cwd.vars.copy()
    start = len(result.commands)
    for index, part in enumerate(parts):
        if index == 1:  # the first part always runs
            before = cwd.vars.copy()
            if alternatives:
                cwd.vars.blocked |= later
        start = len(result.commands)
        if index == len(parts) - 1 and targets is not None:
            start = _walk_redirected(part, data, result, depth, writes, targets, cwd)
        else:
            _walk(part, data, result, depth, writes, cwd)
    cwd.vars.blocked -= later - before.blocked
    if alternatives:
        cwd.vars.forget(later)
    else:
        after = cwd.vars.copy()
        cwd.vars.merge(before, [before, after], cwd.base)
    return start


def _flatten_list(node: Node) -> tuple[list[Node], list[str]]:
    """The parts of a list and the operators between them (tree-sitter nests `a && b || c`
    to the left)."""
    parts: list[Node] = []
    operators: list[str] = []
    for child in node.children:
        if child.type == "list":
            inner, ops = _flatten_list(child)
            parts += inner
            operators += ops
        elif child.is_named:
            parts.append(child)
        elif child.type in ("&&", "||"):
            operators.append(child.type)
    return parts, operators


def _walk_redirected(
    node: Node,
    data: bytes,
    result: ParsedShell,
    depth: int,
    writes: tuple[str, ...],
    targets: tuple[str, ...],
    cwd: _Scope,
) -> int:
    """Walk what a redirect applies to; returns where its commands start in `result`.
    tree-sitter-bash hangs `a && b > f` and `a | b > f` on the whole list or pipeline,
    but bash gives the redirect to `b` alone: only the last part gets the targets."""
    if node.type == "list":
        return _walk_list(node, data, result, depth, writes, cwd, targets)
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
    cwd: _Scope,
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
    fed: SimpleCommand, script: str, result: ParsedShell, depth: int, cwd: _Scope
) -> None:
    """`sh <<EOF … EOF`, `bash <<< '…'`, `. /dev/stdin <<< '…'`: a script the shell runs."""
    runs_stdin = (fed.name in SHELLS and _shell_script(fed) is None) or (
        fed.name in SOURCES and any(a in STDIN_FILES for a in fed.argv[1:])
    )
    if runs_stdin and depth < MAX_NESTING:
        _collect(script, result, depth + 1, cwd.child() if fed.name in SHELLS else cwd)


def _redirect_targets(
    node: Node, data: bytes, operators: frozenset[str], cwd: _Scope
) -> tuple[str, ...]:
    """Files a statement's redirects with these operators name (not fds, not /dev/null);
    a target that holds a variable the line assigned is each of its values."""
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
        for target in _resolved(destination, data, cwd):
            if target != "/dev/null" and not target.isdigit() and not target.startswith("&"):
                targets.append(target)
    return tuple(targets)


def _simple_commands(
    node: Node, data: bytes, writes: tuple[str, ...], cwd: _Scope
) -> list[SimpleCommand]:
    """The command a `command` node runs: one, or one per combination of the values of
    the variables in its words (a `for` variable over `a b` runs it twice)."""
    words: list[list[tuple[str, ...]]] = []  # per word: its alternatives, each some argv words
    assignments: list[str] = []
    dynamic_name = False
    for child in node.children:
        if child.type == "variable_assignment":
            assignments.append(_text(child, data))
        elif child.type == "command_name":
            word_node = child.children[0] if child.children else child
            values = _values(word_node, data, cwd)
            dynamic_name = values is None or len(values) != 1
            words.append([tuple(_expanded(word_node, data))] if dynamic_name else [values or ("",)])
        elif child.type in ("file_redirect", "herestring_redirect", "heredoc_redirect"):
            continue
        elif _has_dynamic(child) and (values := _values(child, data, cwd)) is not None:
            words.append([(v,) for v in values])
        else:
            words.append([tuple(_expanded(child, data))])
    combinations: list[tuple[str, ...]] = [()]
    for alternatives in words:
        combinations = [argv + alt for argv in combinations for alt in alternatives]
    if len(combinations) > MAX_CANDIDATES:  # too many to judge one by one: left unresolved
        combinations = [tuple(w for child in node.children for w in _raw_words(child, data))]
    return [
        SimpleCommand(
            argv, tuple(assignments), writes_to=writes, dynamic_name=dynamic_name, cwd=cwd.base
        )
        for argv in combinations
    ]


def _raw_words(node: Node, data: bytes) -> list[str]:
    if node.type in ("variable_assignment", "file_redirect", "herestring_redirect"):
        return []
    if node.type == "heredoc_redirect":
        return []
    target = node.children[0] if node.type == "command_name" and node.children else node
    return _expanded(target, data)


def _resolved(node: Node, data: bytes, cwd: _Scope) -> list[str]:
    """A word's values where the line says what its variables hold, else as written."""
    if _has_dynamic(node) and (values := _values(node, data, cwd)) is not None:
        return list(values)
    return [_word(node, data)[0]]


def _values(node: Node, data: bytes, cwd: _Scope, quoted: bool = False) -> Values:
    """A word's candidate values given what the line assigned, or None when unknown. An
    unquoted expansion whose value would be split (it holds blanks) is unknown."""
    kind = node.type
    if not _has_dynamic(node):
        return (_word(node, data)[0],)
    if kind == "string":
        parts = [c for c in node.children if c.type not in ('"', "$")]
        return product([_values(c, data, cwd, quoted=True) for c in parts])
    if kind == "concatenation":
        return product([_values(c, data, cwd, quoted) for c in node.children])
    if kind == "simple_expansion":
        name = node.children[-1] if node.children else node
        values = cwd.vars.lookup(_text(name, data), cwd.base)
    elif kind == "expansion":
        values = _expansion(node, data, cwd)
    elif kind == "command_substitution":
        inner = _text(node, data).strip("$()` \t\n")
        values = cwd.vars.lookup("PWD", cwd.base) if inner == "pwd" else None
    elif kind == "arithmetic_expansion":
        values = ("0",)  # a number, whatever it computes
    else:
        return None
    if values is not None and not quoted and any(any(c in v for c in " \t\n") for v in values):
        return None
    return values


def _expansion(node: Node, data: bytes, cwd: _Scope) -> Values:
    """`${name}`, `${name:-word}`, `${name%suffix}` and their kind; None when unknown."""
    parts = [c for c in node.children if c.type not in ("${", "}")]
    if not parts or parts[0].type not in ("variable_name", "special_variable_name"):
        return ("0",) if parts and parts[0].type == "#" else None  # ${#name}: a length
    values = cwd.vars.lookup(_text(parts[0], data), cwd.base)
    if len(parts) == 1 or values is None:
        return values
    operator = _text(parts[1], data)
    closing = node.children[-1]
    operand = data[parts[1].end_byte : closing.start_byte].decode(errors="replace")
    if operator in ("%", "%%", "#", "##"):
        if any(ch in operand for ch in "'\"$`\\"):
            return None
        stripped = [strip(v, operand, operator) for v in values]
        kept = tuple(v for v in stripped if v is not None)
        return kept if len(kept) == len(stripped) else None
    if operator in (":-", "-", ":=", "=", ":+", "+", ":?", "?"):
        rest = parts[2:]
        alternative = product([_values(c, data, cwd, quoted=True) for c in rest]) if rest else ("",)
        if operator in (":?", "?"):
            return values
        if operator in (":+", "+"):
            return union(*(alternative if v or operator == "+" else ("",) for v in values))
        empty = any(v == "" for v in values) and operator.startswith(":")
        return union(tuple(v for v in values if v), alternative) if empty else values
    return None


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


def _look_through(command: SimpleCommand, result: ParsedShell, depth: int, cwd: _Scope) -> None:
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
        _collect(script, result, depth + 1, cwd if command.name == "eval" else cwd.child())


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
