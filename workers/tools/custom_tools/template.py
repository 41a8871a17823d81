"""Custom-tool templates in which a value never becomes code.

A call's values reach its command only through the environment: each argument is in
`CLAWQ_ARG_<key>`, and a placeholder `{{.key}}` is replaced by `"$CLAWQ_ARG_key"`, a
quoted expansion the shell never parses again. So no value is ever spliced into the
line. For that to hold, a placeholder must stand as a whole shell word (bare, or alone
in double quotes), which is checked when the tool is defined, with tree-sitter-bash:
inside single quotes, inside double quotes beside other text, in a heredoc, inside
`$(…)` or backticks, or as part of a longer word it is refused, and so is a placeholder
that would be code rather than data (the command's name, the script of `sh -c`, `eval`,
`source`, an interpreter's `-c`/`-e`, an `awk` or `sed` program). A template may name
`"$CLAWQ_ARG_key"` itself where a value belongs inside other text, always in double
quotes. A missing optional argument drops its word (`${CLAWQ_ARG_key+"$CLAWQ_ARG_key"}`).

What is judged and shown (exec's shell safety, an approval) is the `preview`: the same
line with each value shell-quoted in its word, never run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from typing import Any

from tree_sitter import Node

from broker.errors import Invalid
from workers.confine.shell import bash_parser, parse_shell

ARG_PREFIX = "CLAWQ_ARG_"
PLACEHOLDER = re.compile(r"\{\{\s*\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
SENTINEL = "__clawq_placeholder_{}__"
SENTINEL_RE = re.compile(r"__clawq_placeholder_(\d+)__")
DIRECT = re.compile(r"^" + ARG_PREFIX + r"([A-Za-z_][A-Za-z0-9_]*)$")
# a placeholder below one of these is not a word of a command the template runs directly
NESTED = {
    "command_substitution": "inside $(…) or backticks",
    "process_substitution": "inside <(…) or >(…)",
    "arithmetic_expansion": "inside $((…))",
    "expansion": "inside ${…}",
    "heredoc_body": "in a heredoc",
    "heredoc_redirect": "in a heredoc",
}
# interpreters → the options whose next argument is a program they run
CODE_OPTIONS = {
    **dict.fromkeys(("python", "python2", "python3"), ("-c",)),
    "perl": ("-e", "-E"),
    "ruby": ("-e",),
    "node": ("-e", "--eval", "-p", "--print"),
    "php": ("-r",),
    "lua": ("-e",),
}
PROGRAM_FIRST = {"awk", "gawk", "mawk", "nawk", "sed", "gsed"}  # the first operand is a program
PROGRAM_OPTIONS = {"-e", "--expression", "--source", "-f", "--file"}
VALUE_OPTIONS = PROGRAM_OPTIONS | {"-F", "-v", "-l", "--field-separator", "--assign"}
# a word here is a plain argument of a command the template runs
WORD_PARENTS = {
    "command",
    "file_redirect",
    "herestring_redirect",
    "for_statement",
    "case_statement",
}
# where a variable's value is evaluated as arithmetic (bash runs `a[$(cmd)]` there)
ARITHMETIC = {"arithmetic_expansion", "test_command"}


class TemplateError(Invalid, ValueError):
    """A template that could let a value become code; the message says what to change."""


@dataclass(frozen=True)
class Slot:
    """Where one placeholder's word is in the canonical template (byte offsets)."""

    key: str
    start: int
    end: int


@dataclass(frozen=True)
class Template:
    """A checked template: `source` is the command with each placeholder as a sentinel."""

    source: str
    slots: tuple[Slot, ...]
    optional: frozenset[str]
    keys: frozenset[str]  # every parameter: each present one goes to the environment

    def render(self, arguments: dict[str, Any]) -> tuple[str, dict[str, str]]:
        """The command to run and the environment carrying the values."""
        env = {
            ARG_PREFIX + k: value_text(k, v)
            for k, v in arguments.items()
            if k in self.keys and v is not None
        }

        def word(slot: Slot) -> str:
            name = ARG_PREFIX + slot.key
            if slot.key in self.optional:
                return f'${{{name}+"${name}"}}'
            return f'"${name}"'

        return self._fill(word), env

    def preview(self, arguments: dict[str, Any]) -> str:
        """The line with each value shell-quoted in its word: judged and shown, never run."""

        def word(slot: Slot) -> str:
            raw = arguments.get(slot.key)
            return "" if raw is None else shlex.quote(value_text(slot.key, raw))

        return self._fill(word)

    def _fill(self, word: Any) -> str:
        data = self.source.encode()
        out, at = [], 0
        for slot in self.slots:
            out.append(data[at : slot.start].decode())
            out.append(word(slot))
            at = slot.end
        out.append(data[at:].decode())
        return "".join(out)


def value_text(key: str, raw: Any) -> str:
    """An argument as the text of its environment variable."""
    if isinstance(raw, bool):
        text = "true" if raw else "false"
    elif isinstance(raw, int | float | str):
        text = str(raw)
    else:
        text = json.dumps(raw, ensure_ascii=False)
    if "\x00" in text:
        raise TemplateError(f"{key}: contains a NUL character, which no command argument can hold")
    return text


def check(command: str, parameters: dict[str, Any]) -> Template:
    """The template, checked; raises `TemplateError` naming every placeholder that breaks
    the rule and how to write it instead."""
    properties = set((parameters.get("properties") or {}).keys())
    required = set(parameters.get("required") or [])
    keys: list[str] = []

    def sentinel(match: re.Match[str]) -> str:
        keys.append(match.group(1))
        return SENTINEL.format(len(keys) - 1)

    if SENTINEL_RE.search(command):
        raise TemplateError("the command may not contain __clawq_placeholder_N__")
    source = PLACEHOLDER.sub(sentinel, command)
    data = source.encode()
    tree = bash_parser().parse(data)
    if tree.root_node.has_error:
        raise TemplateError("the command does not parse as shell")
    problems: list[str] = []
    refused: set[str] = set()
    slots: list[Slot] = []
    for match in SENTINEL_RE.finditer(source):
        key = keys[int(match.group(1))]
        start = len(source[: match.start()].encode())
        end = start + len(match.group(0).encode())
        node = tree.root_node.descendant_for_byte_range(start, end)
        where, word = _position(node, start, end)
        if where:
            problems.append(_advice(key, where, _statement(node, data)))
            refused.add(key)
        elif word is not None:
            slots.append(Slot(key, word.start_byte, word.end_byte))
    problems += _direct_problems(tree.root_node, data, properties)
    problems += _code_problems(source, keys, refused)
    if problems:
        raise TemplateError("; ".join(dict.fromkeys(problems)))
    optional = frozenset(k for k in keys if k not in required)
    return Template(
        source, tuple(sorted(slots, key=lambda s: s.start)), optional, frozenset(properties)
    )


def _position(node: Node | None, start: int, end: int) -> tuple[str, Node | None]:
    """Why a placeholder at [start, end) is not a whole word (empty: it is), and its word."""
    if node is None:
        return "outside any command", None
    for up in _ancestors(node):
        if up.type in ("raw_string", "ansi_c_string"):
            return "inside single quotes", None
        if up.type in NESTED:
            return NESTED[up.type], None
    word: Node | None = None
    if node.type == "word" and (node.start_byte, node.end_byte) == (start, end):
        word = node
    elif node.type == "string_content" and node.parent is not None:
        string = node.parent
        if (string.start_byte + 1, string.end_byte - 1) != (start, end):
            return "inside double quotes beside other text", None
        word = string
    elif any(up.type == "string" for up in _ancestors(node)):
        return "inside double quotes beside other text", None
    parent = word.parent.type if word is not None and word.parent is not None else ""
    if word is None or parent == "concatenation":
        return "part of a longer word", None
    if parent == "command_name":
        return "the command's name", None
    if parent not in WORD_PARENTS:
        return f"in a {parent.replace('_', ' ')}", None
    return "", word


def _ancestors(node: Node) -> list[Node]:
    found = []
    at: Node | None = node
    while at is not None:
        found.append(at)
        at = at.parent
    return found


def _statement(node: Node | None, data: bytes) -> str:
    """The text around a placeholder, for the message, placeholders written back."""
    at = node
    while at is not None and at.type not in ("string", "raw_string", "concatenation", "command"):
        at = at.parent
    text = data[at.start_byte : at.end_byte].decode() if at is not None else ""
    return SENTINEL_RE.sub("…", text)[:80]


def _advice(key: str, where: str, around: str) -> str:
    name = ARG_PREFIX + key
    fix = {
        "inside double quotes beside other text": f'write "…${name}…" (the value from the '
        f"environment) or make {{{{.{key}}}}} a word of its own",
        "inside single quotes": f'write "${name}" in double quotes, or {{{{.{key}}}}} as a '
        "word of its own",
        "in a heredoc": f"write ${name} in the heredoc (its value is not parsed again), or "
        f"printf '%s\\n' {{{{.{key}}}}}",
        "part of a longer word": f'write "prefix${name}" in double quotes, or make '
        f"{{{{.{key}}}}} a word of its own",
        "the command's name": "a value is only data, never the command that runs",
    }.get(where, f'use "${name}" there, or make {{{{.{key}}}}} a word of a command of its own')
    shown = f" ({around})" if around else ""
    return f"{{{{.{key}}}}} is {where}{shown}: {fix}"


def _direct_problems(root: Node, data: bytes, properties: set[str]) -> list[str]:
    """`$CLAWQ_ARG_key` written in the template: a declared key, in double quotes (or a
    heredoc), never evaluated as arithmetic."""
    problems = []
    stack = [root]
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.type != "variable_name":
            continue
        name = data[node.start_byte : node.end_byte].decode()
        found = DIRECT.match(name)
        if not found:
            continue
        if found.group(1) not in properties:
            problems.append(f"${name} names no declared parameter")
        ancestors = [up.type for up in _ancestors(node)]
        if ARITHMETIC & set(ancestors):
            problems.append(f"${name} would be evaluated as arithmetic, which can run code")
        elif not _quoted(ancestors):
            problems.append(f'${name} stands unquoted (split and globbed): write "${name}"')
    return problems


def _quoted(ancestors: list[str]) -> bool:
    """In double quotes or a heredoc, nearer than any `$(…)` (which quotes anew)."""
    for kind in ancestors:
        if kind in ("string", "heredoc_body"):
            return True
        if kind in ("command_substitution", "process_substitution"):
            return False
    return False


def _code_problems(source: str, keys: list[str], refused: set[str]) -> list[str]:
    """A placeholder that a command would run as code: a command's name (also after a
    wrapper or in `find -exec`), the script of `sh -c`/`eval`/`source`, a program."""
    parsed = parse_shell(source)
    if not parsed.ok:
        return []

    def named(text: str) -> list[str]:
        found = (keys[int(m.group(1))] for m in SENTINEL_RE.finditer(text))
        return [k for k in found if k not in refused]

    problems = []
    for c in parsed.commands:
        if not c.argv:
            continue
        for key in named(c.argv[0]):
            problems.append(f"{{{{.{key}}}}} would run as a command: a value is only data")
        name, args = os.path.basename(c.argv[0]), list(c.argv[1:])
        script: list[str] = []
        if name in ("eval", "source", "."):
            script = args
        for flag in CODE_OPTIONS.get(name, ()):
            script += [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]
        if name in PROGRAM_FIRST:
            given = [args[i + 1] for i, a in enumerate(args[:-1]) if a in PROGRAM_OPTIONS]
            script += given or _operands(args)[:1]
        for key in (k for text in script for k in named(text)):
            problems.append(
                f"{{{{.{key}}}}} would be code that `{name}` runs: a value is only data"
            )
    return problems


def _operands(args: list[str]) -> list[str]:
    """The operands of an awk or sed command line (option values skipped)."""
    found, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in VALUE_OPTIONS:
            skip = True
        elif not arg.startswith("-") or arg == "-":
            found.append(arg)
    return found
