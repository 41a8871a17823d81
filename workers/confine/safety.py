"""Shell safety by parsing, not by regex on the raw string.

Every command a line would run (see `workers.confine.shell`) is judged, with its flags understood
in any order, case and spelling, and its paths resolved where they point after the
line's `cd`s. Categories: the seed's destructive file operations, disk destruction,
system control, fork bombs, remote code execution, reverse shells and eval injection,
plus data exfiltration, privilege escalation, persistence and writes outside the
workspace. A command that merely mentions a word (`grep -r shutdown docs/`,
`echo "format check"`) is not judged by that word. What an interpreter does with inline
code (`python3 -c …`) is not guessed: confinement (`workers.confine.host`) contains it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

from workers.confine.shell import parse_shell
from workers.confine.shell_commands import SHELLS, ParsedShell, SimpleCommand, find_parts
from workers.confine.targets import (
    DELETERS,
    DEVICE,
    FIND_TESTS,
    KERNEL,
    PERSISTENT,
    RC_FILES,
    SENSITIVE,
    TARGET_TAKERS,
    changed_paths,
    escapes_workspace,
    flags_of,
    has_long,
    home_of,
    is_outside,
    is_whole,
    reads_sensitive,
    seen_from,
    unknown_path,
    write_targets,
)

INTERPRETERS = SHELLS | {"python", "python2", "python3", "perl", "ruby", "node", "php", "lua"}
DOWNLOADERS = frozenset({"curl", "wget", "fetch", "aria2c", "http", "https", "lwp-download"})
DECODERS = frozenset({"base64", "base32", "xxd", "uudecode", "openssl", "gunzip", "zcat", "rev"})
NETCATS = frozenset({"nc", "ncat", "netcat", "socat", "telnet"})
SENDERS = NETCATS | {"curl", "wget", "scp", "rsync", "sftp", "ftp", "http", "https"}
# per tool, options whose value is a credential the tool uses, not one it sends
_SSH_USE = frozenset({"-i", "-F", "-o"})
_CURL_USE = frozenset({"-E", "--cert", "--key", "--cacert", "--capath"})
CREDENTIAL_USE = {
    "scp": _SSH_USE,
    "sftp": _SSH_USE,
    "rsync": _SSH_USE,
    "curl": _CURL_USE,
    "wget": frozenset({"--certificate", "--private-key", "--ca-certificate"}),
}
SYSTEMCTL_PERSIST = frozenset({"enable", "reenable", "link", "preset", "set-default", "edit"})


@dataclass(frozen=True)
class Finding:
    category: str
    command: str
    why: str

    def message(self) -> str:
        return f"blocked ({self.category}): `{self.command}` {self.why}"


def _destructive(c: SimpleCommand) -> str | None:
    flags, operands = flags_of(c.argv)
    if c.name == "rm":
        recursive = bool(flags & {"r", "R"}) or has_long(flags, "recursive")
        if "no-preserve-root" in flags:
            return "removes without root protection"
        for o in operands:
            resolved = c.resolve(o)
            if recursive and (is_outside(resolved) or is_whole(resolved)):
                return (
                    "removes a tree outside the workspace (or all of it) recursively"
                    + seen_from(c, o)
                )
    if c.name == "find":
        starts, expression, actions = find_parts(c.argv)
        deleting = "-delete" in expression or any(
            os.path.basename(a[0]) in DELETERS for a in actions
        )
        selective = bool(FIND_TESTS & set(expression))
        for start in starts or ["."]:
            resolved = c.resolve(start)
            if deleting and is_outside(resolved):
                return "deletes a tree outside the workspace" + seen_from(c, start)
            if deleting and is_whole(resolved) and not selective:
                return "deletes the whole workspace (no -name, -path or other test narrows it)"
    recursive_mode = c.name in ("chmod", "chown", "chgrp") and (
        "R" in flags or has_long(flags, "recursive")
    )
    if recursive_mode and any(
        o in ("/", "/*", "~") or o.startswith(("/etc", "/usr", "/bin")) for o in operands
    ):
        return "changes ownership or modes of system trees"
    if c.name == "shred" and any(is_outside(c.resolve(o)) for o in operands):
        return "overwrites files outside the workspace"
    outside = next((o for o in operands if escapes_workspace(c, o)), None)
    if c.name in ("rm", "unlink", "rmdir") and outside is not None:
        return f"removes {outside}, outside the workspace" + seen_from(c, outside)
    return None


def _disk(c: SimpleCommand) -> str | None:
    if re.fullmatch(r"mkfs(\.\w+)?|mke2fs|mkdosfs|mkntfs", c.name) or c.name in (
        "wipefs",
        "mkswap",
    ):
        return "formats a disk"
    if c.name == "dd" and any(a.startswith("of=/dev/") and DEVICE.match(a[3:]) for a in c.argv):
        return "writes raw blocks to a disk"
    if c.name in ("fdisk", "sfdisk", "parted", "sgdisk", "gdisk") and len(c.argv) > 1:
        return "rewrites a partition table"
    if any(DEVICE.match(t) for t in c.writes_to):
        return "redirects output onto a disk device"
    if c.name == "shred" and any(DEVICE.match(a) for a in c.argv[1:]):
        return "overwrites a disk"
    return None


def _system(c: SimpleCommand) -> str | None:
    if c.name in ("shutdown", "reboot", "poweroff", "halt", "kexec", "telinit"):
        return "stops or restarts the machine"
    if c.name == "init" and c.argv[1:2] in (("0",), ("6",)):
        return "stops or restarts the machine"
    if c.name == "systemctl" and any(
        a in ("poweroff", "reboot", "halt", "kexec", "suspend", "hibernate", "rescue", "emergency")
        for a in c.argv[1:]
    ):
        return "stops or restarts the machine"
    if c.name in ("kill", "pkill", "killall") and (
        c.argv[-1:] == ("1",) or "init" in c.argv[1:] or "-1" in c.argv[1:]
    ):
        return "kills init or every process"
    if any(KERNEL.match(c.resolve(t)) for t in write_targets(c)):
        return "writes kernel settings or triggers (/proc/sys, /proc/sysrq-trigger, /sys)"
    if c.name == "sysctl" and any(a == "-w" or "=" in a for a in c.argv[1:]):
        return "changes kernel settings"
    return None


def _persistence(c: SimpleCommand) -> str | None:
    if c.name == "crontab" and c.argv[1:] != ("-l",) and "-l" not in c.argv[1:]:
        return "installs or changes scheduled jobs (crontab)"
    if c.name in ("at", "batch") and "-l" not in c.argv[1:]:
        return "schedules a command to run later"
    if c.name == "systemctl" and SYSTEMCTL_PERSIST & set(c.argv[1:]):
        return "makes a service start at boot or login"
    for target in write_targets(c):
        resolved = c.resolve(target)
        if not is_outside(resolved):
            continue
        if PurePosixPath(resolved).name in RC_FILES or PERSISTENT.search(resolved):
            return f"writes {target}, which runs again later (shell start-up, cron, ssh, systemd)"
    return None


def _writes_outside(c: SimpleCommand) -> str | None:
    for target in write_targets(c):
        if escapes_workspace(c, target):
            return f"writes {target}, outside the workspace" + seen_from(c, target)
    return None


def _reverse_shell(c: SimpleCommand) -> str | None:
    redirects = " ".join((*c.writes_to, *c.reads_from))
    if "/dev/tcp/" in redirects or "/dev/udp/" in redirects:
        return "opens a raw network connection through /dev/tcp"
    words = " ".join(c.argv)
    flags, _ = flags_of(c.argv)
    if c.name in ("nc", "ncat", "netcat") and (
        flags & {"e", "c"} or has_long(flags, "exec") or has_long(flags, "sh-exec")
    ):
        return "binds a shell to a network connection"
    if c.name == "socat" and any(re.match(r"(?i)(exec|system):", a) for a in c.argv[1:]):
        return "binds a program to a network connection"
    if (
        c.name in INTERPRETERS
        and "socket" in words
        and re.search(r"pty|subprocess|dup2|exec", words)
    ):
        return "runs a socket-connected shell"
    return None


def _privilege(c: SimpleCommand) -> str | None:
    if c.name in ("sudo", "su", "doas", "pkexec", "runuser", "setpriv"):
        return "changes user (privilege escalation)"
    if c.name == "chmod" and any(
        re.fullmatch(r"(u|g|ug|a)?\+s|[2-7][0-7]{3}", a) for a in c.argv[1:]
    ):
        return "sets the setuid/setgid bit"
    if c.name == "setcap":
        return "grants file capabilities"
    system_files = ("/etc/sudoers", "/etc/passwd", "/etc/shadow", "/etc/group", "/etc/gshadow")
    if any(c.resolve(t).startswith(system_files) for t in write_targets(c)):
        return "writes the system's user or sudo files"
    return None


def _eval(c: SimpleCommand) -> str | None:
    if c.name == "eval" and any("$" in a or "`" in a for a in c.argv[1:]):
        return "evaluates text computed at run time"
    if c.name in INTERPRETERS and any(
        ("$(" in a or "`" in a or "<(" in a) and re.search(r"\b(curl|wget)\b", a)
        for a in c.argv[1:]
    ):
        return "runs a downloaded script"
    if c.name in ("source", ".") and any(
        "<(" in a and re.search(r"\b(curl|wget)\b", a) for a in c.argv[1:]
    ):
        return "sources a downloaded script"
    return None


COMMAND_CHECKS: list[tuple[str, Callable[[SimpleCommand], str | None]]] = [
    ("destructive file operation", _destructive),
    ("disk destruction", _disk),
    ("system control", _system),
    ("reverse shell", _reverse_shell),
    ("privilege escalation", _privilege),
    ("persistence", _persistence),
    ("eval injection", _eval),
]


def _reads_stdin_script(c: SimpleCommand) -> bool:
    """An interpreter that runs what it reads on stdin (`sh`, `bash -s`, `python -`)."""
    if c.name not in INTERPRETERS:
        return False
    operands = [a for a in c.argv[1:] if not a.startswith("-")]
    return not operands or operands == ["-"] or "-s" in c.argv


def _pipelines(parsed: ParsedShell) -> Finding | None:
    for stages in parsed.pipelines:
        for i, stage in enumerate(stages):
            upstream = parsed.stage_commands(stage)
            for later in stages[i + 1 :]:
                for sink in parsed.stage_commands(later):
                    for source in upstream:
                        text = f"{source.text} | {sink.text}"
                        if source.name in DOWNLOADERS and _reads_stdin_script(sink):
                            return Finding(
                                "remote code execution",
                                text,
                                "pipes a download into an interpreter",
                            )
                        if source.name in DECODERS and _reads_stdin_script(sink):
                            return Finding(
                                "eval injection", text, "pipes decoded text into an interpreter"
                            )
                        if reads_sensitive(source) and sink.name in SENDERS:
                            return Finding(
                                "data exfiltration",
                                text,
                                "sends a credential file over the network",
                            )
                        if _reads_stdin_script(source) and sink.name in NETCATS:
                            return Finding(
                                "reverse shell", text, "connects a shell's output to the network"
                            )
                        if source.name in NETCATS and _reads_stdin_script(sink):
                            return Finding("reverse shell", text, "feeds network input to a shell")
    return None


def _exfiltration(c: SimpleCommand) -> str | None:
    if c.name not in SENDERS:
        return None
    skip = False
    for arg in c.argv[1:]:
        if skip:
            skip = False
            continue
        if arg.split("=", 1)[0] in CREDENTIAL_USE.get(c.name, ()):
            skip = "=" not in arg
            continue
        remote = re.match(r"^[\w.-]+@[\w.-]+:", arg)  # user@host:path is a destination
        value = "" if remote else re.split(r"[=@]", arg)[-1]
        if SENSITIVE.search(home_of(value)):
            return "sends a credential file over the network"
    if any(SENSITIVE.search(home_of(r)) for r in c.reads_from):
        return "sends a credential file over the network"
    return None


LAST_CHECKS = [
    *COMMAND_CHECKS,
    ("data exfiltration", _exfiltration),
    ("write outside the workspace", _writes_outside),
]


def judge(parsed: ParsedShell) -> Finding | None:
    """The first dangerous thing the line would do, or None. `parsed` must be ok."""
    for name, calls in parsed.self_calls.items():
        if calls >= 2:
            return Finding(
                "fork bomb", f"{name}() {{ … }}", "defines a function that multiplies itself"
            )
    if finding := _pipelines(parsed):
        return finding
    for command in parsed.commands:
        for category, check in LAST_CHECKS:
            if why := check(command):
                return Finding(category, command.text, why)
    return None


def unknown_targets(parsed: ParsedShell) -> str | None:
    """Why a line cannot be checked although nothing in it is known to be dangerous: a
    command that changes files gets its targets from stdin or a file (`… | xargs rm -rf`),
    or writes where the line does not say (`rm -rf "$TMP"/x`, `cd "$DIR" && touch f`), or
    its name is computed, so no one can say what it will touch. Confinement holds the
    workspace boundary whatever the targets are; unconfined, such a line is asked."""
    for c in parsed.commands:
        if c.wrapper:
            continue
        if c.stdin_args and c.name in TARGET_TAKERS:
            return f"`{c.text}` takes its targets from its input, so they cannot be checked"
        if c.dynamic_name:
            return f"`{c.text}`: the command's name is computed at run time"
        for target in changed_paths(c):
            if unknown_path(c.resolve(target)):
                where = f" (in {c.cwd})" if unknown_path(c.cwd) else ""
                return f"`{c.text}` writes {target}{where}, which is not known until it runs"
    return None


def check_line(line: str, base: str = ".") -> tuple[Literal["deny", "ask", "confined"], str] | None:
    """A shell tool's own verdict on a line run in `base`: ("deny", why) for what is known
    to be dangerous; ("ask", why) for a line that does not parse; ("confined", why) for one
    whose targets cannot be known (it may run where commands are confined, and is asked
    elsewhere); None when nothing in it needs either."""
    if finding := judge_line(line, base):
        return "deny", finding.message()
    parsed = parse_shell(line, base)
    if not parsed.ok:
        return "ask", f"{parsed.error}, so it cannot be checked against the rules"
    if reason := unknown_targets(parsed):
        return "confined", reason
    return None


RAW_REVERSE_SHELL = re.compile(r"/dev/(tcp|udp)/")


def judge_line(line: str, base: str = ".") -> Finding | None:
    """`judge` for a raw line run in `base` (the working dir, relative to the workspace).
    A line that does not parse is left to approval, except for what is dangerous in any
    syntax (a /dev/tcp socket, e.g. `exec 5<>/dev/tcp/h/80`, which tree-sitter-bash
    cannot parse)."""
    parsed = parse_shell(line, base)
    if parsed.ok:
        return judge(parsed)
    if RAW_REVERSE_SHELL.search(line):
        return Finding("reverse shell", line.strip()[:200], "opens a raw network connection")
    return None
