"""What a shell variable holds at a point of a line, when the line itself says so.

`out=build; rm -rf "$out"/tmp` removes build/tmp: same-line assignments, `export`,
`for` variables over words or workspace globs, `$HOME` and (in a line that never changes
directory) `$PWD` are resolved, so a write target that holds a variable is judged where
it points. A value is a tuple of candidates (a `for` variable has one per word; a glob
stands for the names it matches), or None when the line does not say: read from input,
computed by a command, assigned in a function, changed by arithmetic or a `source`d
file, or assigned where it may not run (a branch, a loop, after `||`). Unknown never
means harmless: the caller asks, or runs the command confined.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

MAX_CANDIDATES = 16
Values = tuple[str, ...] | None
NUMERIC = frozenset({"$", "?", "#", "!"})  # special parameters that are always a number
# commands that set the variables they name from input or computation
SETTERS = frozenset({"read", "mapfile", "readarray", "getopts", "unset", "let", "printf"})
MOVES_CWD = re.compile(r"(?<![\w-])(cd|pushd|popd)(?![\w-])")
GLOB = re.compile(r"[*?\[]")


def union(*values: Values) -> Values:
    """Every candidate of every value, or None if any is unknown or there are too many."""
    found: dict[str, None] = {}
    for value in values:
        if value is None:
            return None
        found.update(dict.fromkeys(value))
    return tuple(found) if len(found) <= MAX_CANDIDATES else None


def product(parts: list[Values]) -> Values:
    """The candidates of words joined from parts, or None."""
    out: tuple[str, ...] = ("",)
    for part in parts:
        if part is None:
            return None
        out = tuple(a + b for a in out for b in part)
        if len(out) > MAX_CANDIDATES:
            return None
    return out


@dataclass
class Vars:
    """The variables of one shell, as far as the line says (`unstable` is never known)."""

    known: dict[str, Values] = field(default_factory=dict)
    exported: set[str] = field(default_factory=set)
    unstable: set[str] = field(default_factory=set)
    blocked: set[str] = field(default_factory=set)  # assigned after `||`: unknown for now
    opaque: bool = False  # a `source`d file or computed `eval` may set anything
    moves_cwd: bool = False  # the line changes directory somewhere

    def copy(self) -> Vars:
        """A subshell's: it starts with everything, and nothing flows back."""
        return Vars(
            dict(self.known),
            set(self.exported),
            self.unstable,
            set(self.blocked),
            self.opaque,
            self.moves_cwd,
        )

    def child(self) -> Vars:
        """A new shell's (`sh -c`, `bash <<EOF`): only exported values reach it."""
        return Vars({n: self.lookup(n, ".") for n in self.exported}, set(self.exported))

    def lookup(self, name: str, base: str) -> Values:
        if self.opaque or name in self.unstable or name in self.blocked:
            return None
        if name in self.known:
            return self.known[name]
        if name == "HOME":
            return ("~",)
        if name == "PWD":  # relative to the exec's working dir, which a `cd` would move
            return (".",) if base == "." and not self.moves_cwd else None
        if name in NUMERIC:
            return ("0",)
        return None

    def assign(self, name: str, value: Values, export: bool = False) -> None:
        self.known[name] = value
        if export:
            self.exported.add(name)

    def forget(self, names: set[str]) -> None:
        for name in names:
            self.known[name] = None

    def merge(self, before: Vars, branches: list[Vars], base: str) -> None:
        """After branches of which one ran (each a copy of `before`): every candidate."""
        changed = {n for b in branches for n in b.known if b.known[n] != before.known.get(n, 0)}
        for name in changed:
            self.known[name] = union(*(b.lookup(name, base) for b in branches))
        self.exported |= {n for b in branches for n in b.exported}


def strip(value: str, pattern: str, op: str) -> str | None:
    """`${v#p}`, `${v##p}`, `${v%p}`, `${v%%p}` of one candidate; None when unknown. A glob
    candidate (the names a `for` glob matches) keeps only a literal suffix removal, which
    cannot take it out of its directory."""
    if GLOB.search(value):
        if op not in ("%", "%%") or GLOB.search(pattern) or "/" in pattern:
            return None
        if any(part.startswith(".") for part in value.split("/")):
            return None
        return value[: -len(pattern)] if pattern and value.endswith(pattern) else value
    size = len(value)
    if op in ("#", "##"):
        cuts = range(size + 1) if op == "#" else range(size, -1, -1)
        return next((value[i:] for i in cuts if fnmatch.fnmatchcase(value[:i], pattern)), value)
    cuts = range(size, -1, -1) if op == "%" else range(size + 1)
    return next((value[:i] for i in cuts if fnmatch.fnmatchcase(value[i:], pattern)), value)
