"""The words of a shell command as tree-sitter-bash gives them: their values where the line
says what its variables hold, expansions, braces and ANSI-C quoting undone, redirect
targets, and the simple commands a `command` node runs."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field

import bracex
from tree_sitter import Node

from workers.confine.shell_commands import SOURCES, STDIN_FILES, SimpleCommand, resolve
from workers.confine.shell_vars import MAX_CANDIDATES, SETTERS, Values, Vars, product, strip, union

MAX_BRACE_WORDS = 64


DYNAMIC_NODES = frozenset(
    {
        "command_substitution",
        "process_substitution",
        "simple_expansion",
        "expansion",
        "arithmetic_expansion",
    }
)


@dataclass
class Scope:
    """What the shell knows before the next command: the directory it runs in (moved by
    `cd`, `pushd` and `popd`) and the variables the line assigned (`workers.confine.shell_vars`)."""

    base: str = "."
    stack: list[str] = field(default_factory=list)
    vars: Vars = field(default_factory=Vars)

    def copy(self) -> Scope:
        """A subshell's: the same values, and nothing flows back."""
        return Scope(self.base, list(self.stack), self.vars.copy())

    def child(self) -> Scope:
        """A new shell's: the same directory, only exported variables."""
        return Scope(self.base, list(self.stack), self.vars.child())

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


def redirect_targets(
    node: Node, data: bytes, operators: frozenset[str], cwd: Scope
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
        for target in resolved_words(destination, data, cwd):
            if target != "/dev/null" and not target.isdigit() and not target.startswith("&"):
                targets.append(target)
    return tuple(targets)


def simple_commands(
    node: Node, data: bytes, writes: tuple[str, ...], cwd: Scope
) -> list[SimpleCommand]:
    """The command a `command` node runs: one, or one per combination of the values of
    the variables in its words (a `for` variable over `a b` runs it twice)."""
    words: list[list[tuple[str, ...]]] = []  # per word: its alternatives, each some argv words
    assignments: list[str] = []
    dynamic_name = False
    for child in node.children:
        if child.type == "variable_assignment":
            assignments.append(text_of(child, data))
        elif child.type == "command_name":
            word_node = child.children[0] if child.children else child
            values = values_of(word_node, data, cwd)
            dynamic_name = values is None or len(values) != 1
            words.append(
                [tuple(expanded_words(word_node, data))] if dynamic_name else [values or ("",)]
            )
        elif child.type in ("file_redirect", "herestring_redirect", "heredoc_redirect"):
            continue
        elif has_dynamic(child) and (values := values_of(child, data, cwd)) is not None:
            words.append([(v,) for v in values])
        else:
            words.append([tuple(expanded_words(child, data))])
    combinations: list[tuple[str, ...]] = [()]
    for alternatives in words:
        combinations = [argv + alt for argv in combinations for alt in alternatives]
    if len(combinations) > MAX_CANDIDATES:  # too many to judge one by one: left unresolved
        combinations = [tuple(w for child in node.children for w in raw_words(child, data))]
    return [
        SimpleCommand(
            argv, tuple(assignments), writes_to=writes, dynamic_name=dynamic_name, cwd=cwd.base
        )
        for argv in combinations
    ]


def raw_words(node: Node, data: bytes) -> list[str]:
    if node.type in ("variable_assignment", "file_redirect", "herestring_redirect"):
        return []
    if node.type == "heredoc_redirect":
        return []
    target = node.children[0] if node.type == "command_name" and node.children else node
    return expanded_words(target, data)


def resolved_words(node: Node, data: bytes, cwd: Scope) -> list[str]:
    """A word's values where the line says what its variables hold, else as written."""
    if has_dynamic(node) and (values := values_of(node, data, cwd)) is not None:
        return list(values)
    return [word_of(node, data)[0]]


def values_of(node: Node, data: bytes, cwd: Scope, quoted: bool = False) -> Values:
    """A word's candidate values given what the line assigned, or None when unknown. An
    unquoted expansion whose value would be split (it holds blanks) is unknown."""
    kind = node.type
    if not has_dynamic(node):
        return (word_of(node, data)[0],)
    if kind == "string":
        parts = [c for c in node.children if c.type not in ('"', "$")]
        return product([values_of(c, data, cwd, quoted=True) for c in parts])
    if kind == "concatenation":
        return product([values_of(c, data, cwd, quoted) for c in node.children])
    if kind == "simple_expansion":
        name = node.children[-1] if node.children else node
        values = cwd.vars.lookup(text_of(name, data), cwd.base)
    elif kind == "expansion":
        values = expansion_values(node, data, cwd)
    elif kind == "command_substitution":
        inner = text_of(node, data).strip("$()` \t\n")
        values = cwd.vars.lookup("PWD", cwd.base) if inner == "pwd" else None
    elif kind == "arithmetic_expansion":
        values = ("0",)  # a number, whatever it computes
    else:
        return None
    if values is not None and not quoted and any(any(c in v for c in " \t\n") for v in values):
        return None
    return values


def expansion_values(node: Node, data: bytes, cwd: Scope) -> Values:
    """`${name}`, `${name:-word}`, `${name%suffix}` and their kind; None when unknown."""
    parts = [c for c in node.children if c.type not in ("${", "}")]
    if not parts or parts[0].type not in ("variable_name", "special_variable_name"):
        return ("0",) if parts and parts[0].type == "#" else None  # ${#name}: a length
    values = cwd.vars.lookup(text_of(parts[0], data), cwd.base)
    if len(parts) == 1 or values is None:
        return values
    operator = text_of(parts[1], data)
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
        alternative = (
            product([values_of(c, data, cwd, quoted=True) for c in rest]) if rest else ("",)
        )
        if operator in (":?", "?"):
            return values
        if operator in (":+", "+"):
            return union(*(alternative if v or operator == "+" else ("",) for v in values))
        empty = any(v == "" for v in values) and operator.startswith(":")
        return union(tuple(v for v in values if v), alternative) if empty else values
    return None


def expanded_words(node: Node, data: bytes) -> list[str]:
    """A word's values: one, or several when an unquoted brace expansion makes more."""
    word, dynamic = word_of(node, data)
    if dynamic or node.type not in ("word", "concatenation") or "{" not in word:
        return [word]
    raw = text_of(node, data)
    if any(q in raw for q in "'\"\\"):
        return [word]  # quoted braces are literal
    try:
        return bracex.expand(raw, limit=MAX_BRACE_WORDS) or [word]
    except (bracex.ExpansionLimitException, ValueError):
        return ["$" + word]  # too many to judge: as unknown as a computed word


def brace_expanded(source: str) -> str | None:
    """The line with each unquoted brace word expanded, or None when nothing changes."""
    if "{" not in source or "," not in source:
        return None
    try:
        words = shlex.split(source, posix=True)
        out = [w for word in words for w in bracex.expand(word, limit=MAX_BRACE_WORDS)]
    except (ValueError, bracex.ExpansionLimitException):
        return None
    return shlex.join(out) if out != words else None


def text_of(node: Node, data: bytes) -> str:
    return data[node.start_byte : node.end_byte].decode(errors="replace")


def has_dynamic(node: Node) -> bool:
    return node.type in DYNAMIC_NODES or any(has_dynamic(c) for c in node.children)


def word_of(node: Node, data: bytes) -> tuple[str, bool]:
    """A word's value with static quoting removed, and whether it is computed."""
    dynamic = has_dynamic(node)
    if dynamic:
        return text_of(node, data), True
    if node.type == "raw_string":
        return text_of(node, data)[1:-1], False
    if node.type == "ansi_c_string":
        return ansi_c(text_of(node, data)[2:-1]), False
    if node.type in ("string", "translated_string"):
        inner = "".join(text_of(c, data) for c in node.children if c.type == "string_content")
        return inner, False
    if node.type == "concatenation":
        return "".join(word_of(c, data)[0] for c in node.children), False
    if node.type == "word":
        return unescape(text_of(node, data)), False
    return text_of(node, data), False


def unescape(word: str) -> str:
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


ARITHMETIC_NODES = frozenset({"arithmetic_expansion", "c_style_for_statement"})

LOOPS = frozenset({"for_statement", "c_style_for_statement", "while_statement", "until_statement"})


def prescan(root: Node, data: bytes, vars: Vars) -> None:
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
            or (kind == "compound_statement" and text_of(node, data).startswith("(("))
        )
        if kind == "variable_name" and in_arithmetic:
            vars.unstable.add(text_of(node, data))
        if kind == "variable_assignment" and in_function:
            vars.unstable.add(assigned_name(node, data))
        if kind == "declaration_command":
            flags = {text_of(c, data) for c in node.children if c.type == "word"}
            if flags - {"-x", "-r", "-g", "-rx", "-xr"} or in_function:
                vars.unstable.update(declared_names(node, data))
        if kind == "command":
            words = [text_of(c, data) for c in node.children if c.type in ("word", "command_name")]
            name = os.path.basename(words[0]) if words else ""
            if name in SETTERS:
                vars.unstable.update(w for w in words[1:] if w.isidentifier())
            if name in SOURCES and not any(w in STDIN_FILES for w in words[1:]):
                vars.opaque = True
            if name == "eval" and has_dynamic(node):
                vars.opaque = True
        stack.extend((c, in_function, in_arithmetic) for c in node.children)


def assigned_name(node: Node, data: bytes) -> str:
    """The variable a `variable_assignment` sets (an array element: the array)."""
    first = node.children[0] if node.children else node
    if first.type == "subscript" and first.children:
        first = first.children[0]
    return text_of(first, data)


def declared_names(node: Node, data: bytes) -> list[str]:
    return [
        assigned_name(c, data) if c.type == "variable_assignment" else text_of(c, data)
        for c in node.children
        if c.type in ("variable_assignment", "variable_name")
    ]


def assigned_names(node: Node, data: bytes) -> set[str]:
    """Every variable a part of the line assigns (a loop's body, a branch)."""
    found: set[str] = set()
    stack = [node]
    while stack:
        at = stack.pop()
        if at.type == "variable_assignment" and (at.parent is None or at.parent.type != "command"):
            found.add(assigned_name(at, data))
        if at.type == "for_statement":
            name = at.child_by_field_name("variable")
            if name is not None:
                found.add(text_of(name, data))
        stack.extend(at.children)
    return found


def assign(node: Node, data: bytes, cwd: Scope, export: bool = False) -> None:
    """A statement `name=value` (or `name+=value`): the variable holds the value's
    candidates from here on (a prefix `name=value cmd` is the command's alone)."""
    parts = node.children
    if not parts or parts[0].type != "variable_name":
        if parts:
            cwd.vars.assign(assigned_name(node, data), None)
        return
    name = text_of(parts[0], data)
    operator = parts[1].type if len(parts) > 1 else "="
    value_nodes = parts[2:]
    value: Values = ("",)
    if value_nodes:
        value = values_of(value_nodes[0], data, cwd, quoted=True)
    if operator == "+=":
        value = product([cwd.vars.lookup(name, cwd.base), value])
    cwd.vars.assign(name, value, export)
