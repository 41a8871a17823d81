"""Facts about the package's shape (issue 29), read from the source itself: no import circle,
no folder of more than 15 modules, no module over 500 lines, no class over 300 lines, and the
floors broker ← workers ← orchestrator never imported upwards.

Every import counts, a function's own included (a circle hidden in a function is still a
circle); only imports under `if TYPE_CHECKING:` do not, since they never run."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("broker", "workers", "orchestrator")
FLOOR = {"broker": 0, "workers": 1, "orchestrator": 2}
MAX_MODULES, MAX_LINES, MAX_CLASS_LINES = 15, 500, 300


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, name: str, is_package: bool) -> Iterator[str]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            yield from (i for child in node.orelse for i in _imports(child, name, is_package))
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # the module a name is, if it is one, else the module it comes from
            yield from (f"{base}.{alias.name}" for alias in node.names)
        else:
            yield from _imports(node, name, is_package)


def graph() -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        for target in _imports(tree, name, path.name == "__init__.py"):
            # `from a.b import c`: the module a.b.c if it is one, else a.b
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges[name].add(target)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(set(edges) | {w for targets in edges.values() for w in targets}):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle() -> None:
    assert circles(graph()) == []


def test_no_import_from_a_higher_floor() -> None:
    upward = [
        f"{a} -> {b}"
        for a, targets in graph().items()
        for b in targets
        if FLOOR[b.split(".")[0]] > FLOOR[a.split(".")[0]]
    ]
    assert upward == []


def test_no_folder_holds_more_than_15_modules() -> None:
    counts: dict[Path, int] = defaultdict(int)
    for path in modules().values():
        if path.name != "__init__.py":
            counts[path.parent.relative_to(ROOT)] += 1
    assert {str(d): n for d, n in counts.items() if n > MAX_MODULES} == {}


def test_no_module_over_500_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in modules().values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_no_class_over_300_lines() -> None:
    long = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    long[f"{name}.{node.name}"] = size
    assert long == {}


def test_the_checks_see_a_circle_and_the_whole_tree() -> None:
    """The reader itself: a circle it is shown is found, and it reads every package."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert {n.split(".")[0] for n in modules()} == set(PACKAGES)
    assert len(modules()) > 100
