"""Shell safety by parsing, not by regex on the raw string.

Every command a line would run (see `workers.shell`) is judged, with its flags understood
in any order, case and spelling. Categories: the seed's destructive file operations, disk
destruction, system control, fork bombs, remote code execution, reverse shells and eval
injection, plus data exfiltration and privilege escalation. A command that merely mentions
a word (`grep -r shutdown docs/`, `echo "format check"`) is not judged by that word.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

from workers.shell import SHELLS, ParsedShell, SimpleCommand, parse_shell

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
DEVICE = re.compile(r"^/dev/(sd|hd|vd|xvd|nvme|mmcblk|disk|md|dm-|loop|mapper/)")
SENSITIVE = re.compile(
    r"(^|/)(\.ssh(/|$)|id_(rsa|dsa|ecdsa|ed25519)|\.aws/credentials|\.netrc|\.pgpass|"
    r"\.env(\.|$)|\.npmrc|\.pypirc|\.docker/config\.json|\.kube/config|\.gnupg(/|$))"
    r"|^/etc/(shadow|gshadow|sudoers)|\.pem$|\.key$"
)


@dataclass(frozen=True)
class Finding:
    category: str
    command: str
    why: str

    def message(self) -> str:
        return f"blocked ({self.category}): `{self.command}` {self.why}"


def _flags(argv: tuple[str, ...]) -> tuple[set[str], list[str]]:
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


def _long(flags: set[str], name: str) -> bool:
    """GNU long options may be abbreviated: `--rec` is `--recursive`."""
    return any(len(f) >= 3 and name.startswith(f) for f in flags)


def _outside(path: str) -> bool:
    """A path that leaves the working directory: absolute, home, computed, or `..`."""
    path = path.strip("\"'")
    if path.startswith(("/", "~", "$")):
        return True
    return ".." in PurePosixPath(os.path.normpath(path)).parts


def _dangerous_target(path: str) -> bool:
    """A target whose recursive removal is never an agent's business: outside the working
    directory, or all of it (`.`, `*`, `./*`)."""
    return _outside(path) or os.path.normpath(path.strip("\"'")) in ("*", ".", ".*")


def _destructive(c: SimpleCommand) -> str | None:
    flags, operands = _flags(c.argv)
    if c.name == "rm":
        recursive = bool(flags & {"r", "R"}) or _long(flags, "recursive")
        if "no-preserve-root" in flags:
            return "removes without root protection"
        if recursive and any(_dangerous_target(o) for o in operands):
            return "removes a tree outside the workspace (or all of it) recursively"
    deleting = "-delete" in c.argv or ("-exec" in c.argv and "rm" in c.argv)
    if c.name == "find" and deleting and operands and _outside(operands[0]):
        return "deletes a tree outside the workspace"
    recursive_mode = c.name in ("chmod", "chown", "chgrp") and (
        "R" in flags or _long(flags, "recursive")
    )
    if recursive_mode and any(
        o in ("/", "/*", "~") or o.startswith(("/etc", "/usr", "/bin")) for o in operands
    ):
        return "changes ownership or modes of system trees"
    if c.name == "shred" and any(o.startswith("/") for o in operands):
        return "overwrites files outside the workspace"
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
    return None


def _reverse_shell(c: SimpleCommand) -> str | None:
    redirects = " ".join((*c.writes_to, *c.reads_from))
    if "/dev/tcp/" in redirects or "/dev/udp/" in redirects:
        return "opens a raw network connection through /dev/tcp"
    words = " ".join(c.argv)
    flags, _ = _flags(c.argv)
    if c.name in ("nc", "ncat", "netcat") and (
        flags & {"e", "c"} or _long(flags, "exec") or _long(flags, "sh-exec")
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
    system_files = ("/etc/sudoers", "/etc/passwd", "/etc/shadow")
    if any(t.startswith(system_files) for t in c.writes_to) or (
        c.name == "tee" and any(a.startswith(system_files) for a in c.argv[1:])
    ):
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
                        if _sensitive_reader(source) and sink.name in SENDERS:
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


def _sensitive_reader(c: SimpleCommand) -> bool:
    args = [a for a in c.argv[1:] if not a.startswith("-")] + list(c.reads_from)
    return any(SENSITIVE.search(_home(a)) for a in args)


def _home(path: str) -> str:
    return str(PurePosixPath(path.replace("~", "/home/user", 1))) if path.startswith("~") else path


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
        if SENSITIVE.search(_home(value)):
            return "sends a credential file over the network"
    if any(SENSITIVE.search(_home(r)) for r in c.reads_from):
        return "sends a credential file over the network"
    return None


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
        for category, check in [*COMMAND_CHECKS, ("data exfiltration", _exfiltration)]:
            if why := check(command):
                return Finding(category, command.text, why)
    return None


RAW_REVERSE_SHELL = re.compile(r"/dev/(tcp|udp)/")


def judge_line(line: str) -> Finding | None:
    """`judge` for a raw line. A line that does not parse is left to approval, except for
    what is dangerous in any syntax (a /dev/tcp socket, e.g. `exec 5<>/dev/tcp/h/80`,
    which tree-sitter-bash cannot parse)."""
    parsed = parse_shell(line)
    if parsed.ok:
        return judge(parsed)
    if RAW_REVERSE_SHELL.search(line):
        return Finding("reverse shell", line.strip()[:200], "opens a raw network connection")
    return None
