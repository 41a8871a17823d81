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

import posixpath
from dataclasses import replace
from functools import cache, lru_cache

from tree_sitter import Language, Node, Parser

from workers.confine.shell_commands import (
    ARGUMENT_FEEDERS,
    CD_COMMANDS,
    INPUT_REDIRECTS,
    OUTPUT_REDIRECTS,
    SHELLS,
    SOURCES,
    STDIN_FILES,
    ParsedShell,
    SimpleCommand,
    find_parts,
    is_computed,
    shell_script,
    unwrap,
)
from workers.confine.shell_vars import MOVES_CWD, Values, Vars, union
from workers.confine.shell_words import (
    LOOPS,
    Scope,
    assign,
    assigned_names,
    brace_expanded,
    prescan,
    redirect_targets,
    simple_commands,
    text_of,
    values_of,
    word_of,
)

MAX_COMMAND_CHARS = 10_000


MAX_NESTING = 5


# a new shell runs these: a `cd` inside them does not move the commands after them
SUBSHELL_NODES = frozenset({"subshell", "command_substitution", "process_substitution"})


@cache
def bash_parser() -> Parser:
    import tree_sitter_bash

    return Parser(Language(tree_sitter_bash.language()))


@lru_cache(maxsize=512)
def parse_shell(source: str, base: str = ".") -> ParsedShell:
    """Every simple command in `source`, outermost first, in source order; `base` is the
    exec's working dir, relative to the workspace."""
    if len(source) > MAX_COMMAND_CHARS:
        return ParsedShell(error=f"command longer than {MAX_COMMAND_CHARS} characters")
    result = ParsedShell()
    _collect(source, result, 0, Scope(posixpath.normpath(base or ".")))
    if result.error:
        expanded = brace_expanded(source)  # `{rm,-rf,/}` does not parse, its expansion does
        if expanded is not None:
            retry = ParsedShell()
            _collect(expanded, retry, 0, Scope(posixpath.normpath(base or ".")))
            if retry.ok:
                return retry
    return result


def _collect(source: str, result: ParsedShell, depth: int, cwd: Scope) -> None:
    data = source.encode()
    tree = bash_parser().parse(data)
    if tree.root_node.has_error:
        result.error = "the command does not parse as shell"
        return
    prescan(tree.root_node, data, cwd.vars)
    cwd.vars.moves_cwd |= bool(MOVES_CWD.search(source))
    _walk(tree.root_node, data, result, depth, (), cwd)


def _walk(
    node: Node,
    data: bytes,
    result: ParsedShell,
    depth: int,
    writes: tuple[str, ...],
    cwd: Scope,
) -> None:
    if node.type in SUBSHELL_NODES:
        cwd = cwd.copy()
    if node.type == "redirected_statement":
        targets = writes + redirect_targets(node, data, OUTPUT_REDIRECTS, cwd)
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
        if reads := redirect_targets(node, data, INPUT_REDIRECTS, cwd):
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
            _stdin_script(result.commands[owner], text_of(body, data), result, depth, cwd)
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
            name = text_of(name_node, data)
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
            text_of(parent, data).startswith("export")
            or "-x" in {text_of(c, data) for c in parent.children}
        )
        assign(node, data, cwd, export)
        return
    if node.type == "declaration_command" and text_of(node, data).startswith("export"):
        for child in node.children:
            if child.type == "variable_name":
                cwd.vars.exported.add(text_of(child, data))
    if node.type == "command":
        first = len(result.commands)
        variants = simple_commands(node, data, writes, cwd)
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
            script = word_of(herestring.children[-1], data)[0]
            _stdin_script(variants[0], script, result, depth, cwd)
    for child in node.children:
        _walk(child, data, result, depth, writes if node.type != "command" else (), cwd)


def _walk_loop(
    node: Node,
    data: bytes,
    result: ParsedShell,
    depth: int,
    writes: tuple[str, ...],
    cwd: Scope,
) -> None:
    """A loop's body may run any number of times: what it assigns is unknown when it
    starts (a later round sees an earlier one's) and after it; a `for` variable holds
    each of its words (a glob: the names it matches)."""
    assigned = assigned_names(node, data)
    variable = node.child_by_field_name("variable") if node.type == "for_statement" else None
    items: Values = None
    if variable is not None:
        words = [
            c for c in node.children if c.is_named and c.type not in ("variable_name", "do_group")
        ]
        for word in words:  # substitutions in the list run before the loop
            _walk(word, data, result, depth, writes, cwd)
        has_in = any(c.type == "in" for c in node.children)
        items = union(*(values_of(w, data, cwd) for w in words)) if has_in else None
    cwd.vars.forget(assigned)
    for child in node.children:
        if variable is not None and child.type != "do_group":
            continue
        if variable is not None:
            cwd.vars.assign(text_of(variable, data), items)
        _walk(child, data, result, depth, writes, cwd)
    cwd.vars.forget(assigned)


def _walk_branches(
    node: Node,
    data: bytes,
    result: ParsedShell,
    depth: int,
    writes: tuple[str, ...],
    cwd: Scope,
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
    cwd: Scope,
    targets: tuple[str, ...] | None,
) -> int:
    """`a && b || c`: each part after the first may not run. Along `&&` alone the parts
    run in order, so an assignment holds for the parts after it; after the list it holds
    what it held before or after. With `||`, a later part may run without an earlier
    one, so what the later parts assign is unknown in them and after. `targets`: a
    redirect of the whole list, which bash gives its last part (see `_walk_redirected`).
    Returns where the last part's commands start."""
    parts, operators = _flatten_list(node)
    later = set().union(*(assigned_names(p, data) for p in parts[1:]))
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
    cwd: Scope,
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
    cwd: Scope,
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
    fed: SimpleCommand, script: str, result: ParsedShell, depth: int, cwd: Scope
) -> None:
    """`sh <<EOF … EOF`, `bash <<< '…'`, `. /dev/stdin <<< '…'`: a script the shell runs."""
    runs_stdin = (fed.name in SHELLS and shell_script(fed) is None) or (
        fed.name in SOURCES and any(a in STDIN_FILES for a in fed.argv[1:])
    )
    if runs_stdin and depth < MAX_NESTING:
        _collect(script, result, depth + 1, cwd.child() if fed.name in SHELLS else cwd)


def _look_through(command: SimpleCommand, result: ParsedShell, depth: int, cwd: Scope) -> None:
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
    script = shell_script(command)
    if script is None and command.name == "eval" and not is_computed(command.argv[1:]):
        script = " ".join(command.argv[1:]) or None
    if script is not None:
        result.commands[-1] = replace(command, wrapper=True)
        # `sh -c` is a new shell; `eval` runs in this one, so its `cd`s stay
        _collect(script, result, depth + 1, cwd if command.name == "eval" else cwd.child())
