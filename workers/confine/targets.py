"""What a command touches, for the safety checks: its flags, the files it writes or deletes,
and what kind of place a path is (outside the workspace, unknown, the whole tree, scratch,
a shell's rc file, the kernel's, a device, a credential)."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from workers.confine.shell_commands import SimpleCommand, find_parts

DELETERS = frozenset({"rm", "unlink", "rmdir", "shred"})

# find tests that narrow what it matches; -type, -mindepth and -maxdepth do not
FIND_TESTS = frozenset(
    {
        "-name",
        "-iname",
        "-path",
        "-ipath",
        "-wholename",
        "-iwholename",
        "-regex",
        "-iregex",
        "-lname",
        "-ilname",
        "-newer",
        "-anewer",
        "-cnewer",
        "-newermt",
        "-mtime",
        "-mmin",
        "-atime",
        "-amin",
        "-ctime",
        "-cmin",
        "-size",
        "-empty",
        "-user",
        "-group",
        "-uid",
        "-gid",
        "-perm",
        "-links",
        "-inum",
        "-samefile",
        "-used",
    }
)

# commands whose operands are files they change: with targets from stdin they are unknown
TARGET_TAKERS = DELETERS | {
    "mv",
    "cp",
    "ln",
    "install",
    "tee",
    "truncate",
    "touch",
    "chmod",
    "chown",
    "chgrp",
    "dd",
    "sed",
}

# outside the workspace, but where writes are routine (a private /tmp under confinement)
SCRATCH = (
    "/tmp/",
    "/dev/null",
    "/dev/stdout",
    "/dev/stderr",
    "/dev/tty",
    "/dev/fd/",
    "/proc/self/fd/",
    "/dev/shm/",
)

RC_FILES = frozenset(
    {
        ".bashrc",
        ".bash_profile",
        ".bash_login",
        ".bash_logout",
        ".profile",
        ".zshrc",
        ".zprofile",
        ".zshenv",
        ".zlogin",
        ".kshrc",
        ".cshrc",
        ".tcshrc",
        ".login",
        ".xprofile",
        ".xinitrc",
    }
)

PERSISTENT = re.compile(
    r"(^|/)(authorized_keys2?|\.ssh/(rc|config|environment))$"
    r"|^/etc/(profile(\.d/.*)?|bash\.bashrc|environment|ld\.so\.preload|rc\.local|"
    r"cron[^/]*(/.*)?|anacrontab|systemd/.*|init\.d/.*|update-motd\.d/.*|sudoers\.d/.*)$"
    r"|^/(usr/)?lib/systemd/.*|^/var/spool/cron(/.*)?$|^~/\.config/(systemd|autostart)/.*"
    r"|\.(service|timer|socket)$"
)

KERNEL = re.compile(r"^/proc/(sys(/.*)?|sysrq-trigger|sys/kernel/.*)$|^/sys/.*")

DEVICE = re.compile(r"^/dev/(sd|hd|vd|xvd|nvme|mmcblk|disk|md|dm-|loop|mapper/)")

SENSITIVE = re.compile(
    r"(^|/)(\.ssh(/|$)|id_(rsa|dsa|ecdsa|ed25519)|\.aws/credentials|\.netrc|\.pgpass|"
    r"\.env(\.|$)|\.npmrc|\.pypirc|\.docker/config\.json|\.kube/config|\.gnupg(/|$))"
    r"|^/etc/(shadow|gshadow|sudoers)|\.pem$|\.key$"
)


def flags_of(argv: tuple[str, ...]) -> tuple[set[str], list[str]]:
    """Short flags as single letters (`-Rf` → R, f), long ones as words; and operands."""
    letters: set[str] = set()
    operands: list[str] = []
    after_dashdash = False
    for arg in argv[1:]:
        if after_dashdash or not arg.startswith("-") or arg == "-":
            operands.append(arg)
        elif arg == "--":
            after_dashdash = True
        elif arg.startswith("--"):
            letters.add(arg[2:].split("=", 1)[0].lower())
        else:
            letters.update(arg[1:])
    return letters, operands


def has_long(flags: set[str], name: str) -> bool:
    """GNU long options may be abbreviated: `--rec` is `--recursive`."""
    return any(len(f) >= 3 and name.startswith(f) for f in flags)


def is_outside(path: str) -> bool:
    """A resolved path (see `SimpleCommand.resolve`) that leaves the working directory:
    absolute, home, or `..`. A path the line does not say (`unknown_path`) is not known to."""
    if unknown_path(path):
        return False
    if path.startswith(("/", "~")):
        return True
    return ".." in PurePosixPath(path).parts


def unknown_path(path: str) -> bool:
    """A resolved path that still holds an expansion: a variable the line did not assign,
    a command's output, or a directory a `cd "$X"` moved to."""
    return "$" in path or "`" in path


def is_whole(path: str) -> bool:
    """A resolved path that is the whole working directory (`.`, `*`, `./*`, `.*`)."""
    return path in (".", "*", ".*", "")


def is_scratch(path: str) -> bool:
    """Outside, but where writing is routine: the private /tmp, the standard streams."""
    return any(path == p.rstrip("/") or path.startswith(p) for p in SCRATCH)


def escapes_workspace(c: SimpleCommand, path: str) -> bool:
    """A write to `path` by `c` would change something outside the workspace."""
    resolved = c.resolve(path)
    return is_outside(resolved) and not is_scratch(resolved)


def seen_from(c: SimpleCommand, path: str) -> str:
    """Where a target points, for a refusal, when a `cd` earlier in the line moved it."""
    resolved = c.resolve(path)
    return "" if c.cwd == "." else f" ({path} is {resolved} after the cd)"


def write_targets(c: SimpleCommand) -> list[str]:
    """The files a command writes or replaces, as written: its output redirects, and the
    targets of the commands that write where their operands say."""
    flags, operands = flags_of(c.argv)
    found = list(c.writes_to)
    if c.name in ("tee", "truncate", "touch", "shred", "rm", "unlink", "rmdir"):
        found += operands
    elif c.name in ("cp", "mv", "install", "ln"):
        directory = next(
            (
                a.split("=", 1)[1] if "=" in a else c.argv[i + 2]
                for i, a in enumerate(c.argv[1:])
                if (a == "-t" and i + 2 < len(c.argv)) or a.startswith("--target-directory=")
            ),
            None,
        )
        if directory is not None:
            found.append(directory)
        elif c.name == "install" and "d" in flags:
            found += operands
        elif len(operands) >= 2:
            found.append(operands[-1])
        if c.name == "mv":  # a moved file is gone from where it was
            found += operands
    elif c.name == "dd":
        found += [a[3:] for a in c.argv[1:] if a.startswith("of=")]
    elif c.name == "sed" and ("i" in flags or has_long(flags, "in-place")):
        scripted = (
            bool(flags & {"e", "f"}) or has_long(flags, "expression") or has_long(flags, "file")
        )
        found += operands if scripted else operands[1:]
    return [t for t in found if t and t != "-"]


def reads_sensitive(c: SimpleCommand) -> bool:
    args = [a for a in c.argv[1:] if not a.startswith("-")] + list(c.reads_from)
    return any(SENSITIVE.search(home_of(a)) for a in args)


def home_of(path: str) -> str:
    return str(PurePosixPath(path.replace("~", "/home/user", 1))) if path.startswith("~") else path


def changed_paths(c: SimpleCommand) -> list[str]:
    """What a command writes, deletes or changes the modes of."""
    targets = write_targets(c)
    _, operands = flags_of(c.argv)
    if c.name in ("chmod", "chown", "chgrp"):
        targets += operands[1:]
    if c.name == "find":
        starts, expression, actions = find_parts(c.argv)
        if "-delete" in expression or actions:
            targets += starts or ["."]
    return targets
