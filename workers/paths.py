"""Workspace containment: every path a tool touches resolves inside the job's workspace.

Lexical checks (`..`, absolute paths) are not enough: a symlink in any component, or a hard
link to a file elsewhere, escapes as surely. Paths are resolved with every symlink followed
and compared with the real workspace root; files are then opened without following a final
symlink, and the opened descriptor is checked again through /proc/self/fd, which closes the
window between the check and the open.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from pathlib import Path

from wcmatch import glob as wcglob

from workers.tool import ToolError


class Missing(ToolError):
    """The path does not exist (or a directory on its way)."""


GLOB_FLAGS = wcglob.GLOBSTAR | wcglob.DOTGLOB | wcglob.BRACE


def path_matches(path: str, pattern: str) -> bool:
    """gitignore-like: `secrets`, `secrets/` and `secrets/**` cover the directory and
    everything below it."""
    base = pattern.rstrip("/").removesuffix("/**")
    return any(wcglob.globmatch(path, p, flags=GLOB_FLAGS) for p in (pattern, base, base + "/**"))


def rule_pattern(specifier: str, workspace: str) -> tuple[str, bool]:
    """A path rule's pattern and whether it is absolute: `//abs/**` is absolute, `~/x` is
    in the home directory, `/x`, `./x` and `x` are relative to the workspace root."""
    if specifier.startswith("//"):
        return specifier[1:], True
    if specifier.startswith("~/"):
        return os.path.expanduser(specifier), True
    return os.path.normpath(specifier.lstrip("/")).removeprefix("./"), False


def path_rule_matches(specifier: str, path: str, workspace: str) -> bool:
    """Whether a path rule covers `path` (as the tool was given it) in `workspace`."""
    pattern, absolute = rule_pattern(specifier, workspace)
    candidate = os.path.normpath(os.path.join(workspace, path))
    if absolute:
        return path_matches(candidate, pattern)
    relative = os.path.relpath(candidate, os.path.normpath(workspace))
    return not relative.startswith("..") and path_matches(relative, pattern)


PROTECTED_DIRS = frozenset({".git", ".clawq"})  # version control; clawq's own config
VCS_DIRS = frozenset({".git"})  # skipped by directory walks


class Workspace:
    """The root a job's tools may touch, and the protected paths it may write.

    `read_roots` are further folders that reads (never writes) may resolve into, checked
    the same way (lexically, then with every symlink followed, then the opened descriptor):
    the skill roots, so read_file can read a SKILL.md that skill_search found (goclaw's
    resolvePathWithAllowed)."""

    def __init__(
        self,
        root: str,
        writable: list[str] | None = None,
        hidden: list[str] | None = None,
        read_roots: list[str] | None = None,
    ) -> None:
        if not root or not os.path.isabs(root):
            raise ToolError(f"workspace must be an absolute path, got '{root}'")
        real = os.path.realpath(root)
        if not os.path.isdir(real):
            raise ToolError(f"workspace '{root}' does not exist or is not a directory")
        self.root = real
        self.writable = writable or []
        self.hidden = hidden or []  # relative globs the job's rules keep from read tools
        self.read_roots = [
            os.path.realpath(os.path.expanduser(r))
            for r in read_roots or []
            if r and os.path.isabs(os.path.expanduser(r))
        ]

    def relative(self, real: str) -> str:
        rel = os.path.relpath(real, self.root)
        return "." if rel == "." else rel

    def contains(self, real: str) -> bool:
        return real == self.root or real.startswith(self.root + os.sep)

    def read_root_of(self, path: str) -> str | None:
        """The read-only root (outside the workspace) that holds `path`, if any."""
        if self.contains(path):
            return None
        return next(
            (r for r in self.read_roots if path == r or path.startswith(r.rstrip(os.sep) + os.sep)),
            None,
        )

    def resolve(self, path: str, *, write: bool = False) -> str:
        """The real absolute path of `path`, or ToolError saying how it escapes."""
        if not path or "\x00" in path:
            raise ToolError("path is empty or contains a NUL byte")
        candidate = path if os.path.isabs(path) else os.path.join(self.root, path)
        lexical = os.path.normpath(candidate)
        extra = None if write else self.read_root_of(lexical)
        if extra is not None:
            return self._resolve_read_only(path, candidate, extra)
        if not self.contains(lexical):
            raise ToolError(f"'{path}' is outside the workspace {self.root}; use a path inside it")
        real = os.path.realpath(candidate)
        if not self.contains(real):
            raise ToolError(
                f"'{path}' goes through a symlink that points outside the workspace; "
                "use a path inside it"
            )
        if self.is_hidden(real):
            raise ToolError(f"'{path}' is denied by a permission rule")
        if write:
            self._check_writable(path, real)
        self._check_links(path, real)
        return real

    def _resolve_read_only(self, path: str, candidate: str, root: str) -> str:
        real = os.path.realpath(candidate)
        if self.read_root_of(real) != root:
            raise ToolError(
                f"'{path}' goes through a symlink that points outside the skill root {root}"
            )
        self._check_links(path, real)
        return real

    def is_hidden(self, real: str) -> bool:
        return bool(self.hidden) and any(
            path_matches(self.relative(real), pattern) for pattern in self.hidden
        )

    def _check_writable(self, path: str, real: str) -> None:
        rel = self.relative(real)
        parts = Path(rel).parts
        if any(part in PROTECTED_DIRS for part in parts) and not any(
            fnmatch.fnmatch(rel, pattern) for pattern in self.writable
        ):
            raise ToolError(f"'{path}' is inside a protected directory (.git/) and is read-only")

    def _check_links(self, path: str, real: str) -> None:
        try:
            st = os.lstat(real)
        except FileNotFoundError:
            return
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            raise ToolError(
                f"'{path}' has {st.st_nlink} hard links and may alias a file outside the "
                "workspace; refusing to touch it"
            )

    def open(self, path: str, flags: int, mode: int = 0o644, *, write: bool = False) -> int:
        """A descriptor for `path`, verified to be the contained file after opening."""
        real = self.resolve(path, write=write)
        try:
            fd = os.open(real, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        except IsADirectoryError:
            raise ToolError(f"'{path}' is a directory") from None
        except FileNotFoundError:
            raise Missing(f"'{path}' does not exist") from None
        except OSError as exc:
            raise ToolError(f"cannot open '{path}': {exc.strerror}") from None
        try:
            opened = os.readlink(f"/proc/self/fd/{fd}")
            st = os.fstat(fd)
            if not self.contains(opened) and (write or self.read_root_of(opened) is None):
                raise ToolError(f"'{path}' changed to point outside the workspace; refusing")
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                raise ToolError(f"'{path}' has {st.st_nlink} hard links; refusing to touch it")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def make_parents(self, path: str) -> None:
        """Create the missing parent directories of `path`, each checked for containment."""
        real = self.resolve(path, write=True)
        parent = os.path.dirname(real)
        missing = []
        while not os.path.exists(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        if not self.contains(os.path.realpath(parent)):
            raise ToolError(f"'{path}' would be created outside the workspace")
        for directory in reversed(missing):
            os.mkdir(directory)
            if not self.contains(os.path.realpath(directory)):
                raise ToolError(f"'{path}' would be created outside the workspace")
