"""How a command runs on the worker's host: under bubblewrap, or as the worker itself.

The shell parser explains refusals; it cannot know what `python3 -c …` will do. The
confinement underneath it holds whatever the command is (the way Codex CLI and Claude
Code confine theirs). Under bubblewrap (`CLAWQ_EXEC_CONFINEMENT=auto|bwrap`):

- the filesystem is read-only except the job's workspace and a private `/tmp`;
- the worker's home, `/root`, `/home`, `/run` (service sockets: Docker, PostgreSQL) and
  secret files (`CLAWQ_EXEC_HIDDEN_PATHS`) are empty or gone, and so are other users'
  workspaces (the workspace roots, the job's own bound back), artifact files and
  downloads; the environment is the short list `exec` passes;
- the command has a PID namespace of its own, so `kill -9 -1` reaches only its own tree,
  and no capabilities (as root, only those to own and write files of the workspace);
- there is no network unless the job or its agent allows it (an allow rule `network`,
  or `CLAWQ_EXEC_NETWORK`); then it is the host's network;
- it dies with its worker (`--die-with-parent`), and killing bubblewrap kills the tree;
  an `exec` command is also tied to its worker by a pipe (see `TIED`).

`auto` confines where bubblewrap works and otherwise warns once at worker start; `bwrap`
fails every call closed where it does not work; `none` runs commands as the worker.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from broker.config.settings import Settings
from broker.errors import RunError

log = logging.getLogger("clawq.confine")

SHELL = "/bin/sh"
HOME_SECRETS = (".ssh", ".aws", ".config", ".gnupg", ".kube", ".docker", ".netrc", ".pgpass")
# root keeps only what writing the workspace's files needs (they may belong to others)
ROOT_CAPS = ("CAP_DAC_OVERRIDE", "CAP_CHOWN", "CAP_FOWNER")
PROBE_TIMEOUT_S = 10.0
PRIVATE = ("/tmp", "/dev/shm")  # empty and private in the sandbox
# a path in a command's text: absolute, from home, or leaving by `..` (inside quoted code too)
PATH_WORD = re.compile(
    r"""(?:^|(?<=[\s'"=(:;|&<>`,]))(~?/[^\s'"();|&<>`,]*|\.\.(?:/[^\s'"();|&<>`,]*)?)"""
)
# bubblewrap's --die-with-parent leaves a window of a few milliseconds after its start in
# which a killed worker leaves the sandbox running, reparented to init (measured: 9 of 10
# sandboxes survived a kill 6 ms after the spawn), and a redelivered call would then run
# beside it. So a tied command's stdin is a pipe only its worker holds open: a watcher in
# the sandbox reads it, and at its end (the worker gone) kills the PID namespace's tree.
# The command itself gets /dev/null as its stdin, as an untied one does. A worker killed
# before bubblewrap's child finished its setup can leave that child behind, blocked on its
# dead parent: it never reaches the command.
TIED = 'exec 3<&0; { read -r _ <&3; kill -KILL -1; } & exec 3<&- </dev/null; exec "$0" -c "$1"'


class ConfinementError(RunError):
    """Confinement is required but cannot be had here; the command is not run."""


@dataclass(frozen=True)
class Confinement:
    """The way this process runs host commands, decided once (see `for_settings`)."""

    kind: Literal["bwrap", "none"]
    hidden: tuple[str, ...] = ()
    bwrap: str = "bwrap"
    unavailable: str = ""  # confinement is required but cannot be had: why

    @property
    def confined(self) -> bool:
        return self.kind == "bwrap"

    def argv(
        self,
        command: str,
        workspace: str,
        cwd: str,
        network: bool = False,
        info_fd: int | None = None,
        tied: bool = False,
        readable: tuple[str, ...] = (),
    ) -> list[str]:
        """The argv that runs `sh -c command` in `cwd` under this confinement; `tied`: its
        stdin is the lifeline of `TIED` (only under bubblewrap, whose PID namespace bounds
        the watcher's kill); `readable`: paths shown read-only even under a hidden one (what
        trusted configuration names, such as a hook's program)."""
        if self.unavailable:
            raise ConfinementError(
                "exec confinement is required (CLAWQ_EXEC_CONFINEMENT=bwrap) but bubblewrap "
                f"does not work here: {self.unavailable}; the command was not run"
            )
        shell = [SHELL, "-c", command]
        if not self.confined:
            return shell
        if tied:
            shell = [SHELL, "-c", TIED, SHELL, command]
        return [*self._bwrap(workspace, cwd, network, info_fd, readable), "--", *shell]

    def _bwrap(
        self,
        workspace: str,
        cwd: str,
        network: bool,
        info_fd: int | None,
        readable: tuple[str, ...] = (),
    ) -> list[str]:
        ws = os.path.realpath(workspace)
        args = [self.bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        args += ["--tmpfs", "/tmp", "--tmpfs", "/dev/shm"]
        for path in self.hidden:
            if os.path.exists(path):
                args += _hide(path)
        if network:  # name resolution may live under a hidden /run
            resolv = os.path.realpath("/etc/resolv.conf")
            if any(_under(resolv, h) for h in self.hidden) and os.path.exists(resolv):
                args += ["--ro-bind", resolv, resolv]
        for path in readable:  # before the workspace, which stays writable over them
            if os.path.exists(path):
                args += ["--ro-bind", path, path]
        args += ["--bind", ws, ws]
        home = os.path.expanduser("~")
        for name in HOME_SECRETS:  # a workspace that holds the home keeps its secrets hidden
            path = os.path.join(home, name)
            if _under(path, ws) and os.path.exists(path):
                args += _hide(path)
        args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if not network:
            args.append("--unshare-net")
        args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        if os.geteuid() == 0:
            for cap in ROOT_CAPS:
                args += ["--cap-add", cap]
        if info_fd is not None:
            args += ["--info-fd", str(info_fd)]
        args += ["--chdir", os.path.realpath(cwd)]
        return args


def _hide(path: str) -> list[str]:
    """An empty directory over a directory, /dev/null over a file."""
    return ["--tmpfs", path] if os.path.isdir(path) else ["--ro-bind", "/dev/null", path]


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def hidden_paths(settings: Settings) -> tuple[str, ...]:
    """What a confined command must not see: the settings' list, the worker's home,
    clawq's own state directories, and what belongs to users: the workspace roots (every
    user's workspaces; the job's own is bound back over them), artifact files and browser
    downloads. Resolved (a symlink like /var/run is its target)."""
    candidates = [
        *settings.exec_hidden_paths,
        os.path.expanduser("~"),
        settings.process_state_dir,
        os.environ.get("CLAWQ_HOME", ""),
        settings.workspace_root,
        *granted_roots(settings),
        settings.artifact_dir,
        settings.browser_download_dir,
    ]
    seen: dict[str, None] = {}
    for path in candidates:
        real = os.path.realpath(path) if path and os.path.isabs(path) else ""
        if real and not _under("/usr", real):  # a home of `/` must not hide the system
            seen.setdefault(real, None)
    return tuple(seen)


def granted_roots(settings: Settings) -> list[str]:
    """The workspace roots admins granted in users' ceilings, as the directories that hold
    every user's: `/srv/shared/{user}` is `/srv/shared`."""
    roots = []
    for ceiling in settings.user_ceilings.values():
        for root in ceiling.workspace_roots:
            head, templated, _ = root.partition("{user}")
            if templated:
                head = head.rstrip("/") if head.endswith("/") else os.path.dirname(head)
            roots.append(head)
    return roots


def for_settings(settings: Settings) -> Confinement:
    """This process's confinement for these settings, probed once."""
    return _decide(
        settings.exec_confinement,
        hidden_paths(settings),
        settings.exec_bwrap_path,
    )


@lru_cache(maxsize=8)
def _decide(mode: str, hidden: tuple[str, ...], bwrap_path: str) -> Confinement:
    if mode == "none":
        return Confinement("none")
    found = shutil.which(bwrap_path)
    why = probe(found, hidden) if found else f"{bwrap_path} is not installed"
    if not why and found:
        return Confinement("bwrap", hidden, found)
    if mode == "bwrap":
        log.error("CLAWQ_EXEC_CONFINEMENT=bwrap, but %s: every command will fail", why)
        return Confinement("bwrap", hidden, bwrap_path, unavailable=why)
    log.warning(
        "exec confinement: %s, so commands run unconfined (as this worker); install "
        "bubblewrap, or set CLAWQ_EXEC_CONFINEMENT=none to say this is intended",
        why,
    )
    return Confinement("none")


def probe(bwrap: str, hidden: tuple[str, ...]) -> str:
    """Why a confined `true` does not run here (empty: it does). Inside a container,
    bubblewrap may lack the namespaces it needs."""
    with tempfile.TemporaryDirectory(prefix="clawq-probe-") as ws:
        argv = Confinement("bwrap", hidden, bwrap).argv("true", ws, ws)
        try:
            done = subprocess.run(argv, capture_output=True, timeout=PROBE_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bubblewrap could not start ({exc})"
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip().splitlines()
        return f"bubblewrap failed: {detail[-1] if detail else f'exit {done.returncode}'}"
    return ""


def contains(settings: Settings) -> bool:
    """Whether commands run contained here: in the sandbox, or under bubblewrap that
    works. The orchestrator's answer stands for its workers' (one image, one setting); a
    worker that does not confine refuses a call allowed on it (`CallContext.confined`)."""
    return settings.sandbox_enabled or for_settings(settings).confined


def unseen(confinement: Confinement, command: str, workspace: str, cwd: str) -> list[str]:
    """Paths `command` names that exist on this host but that a confined command does not
    see: under a hidden path or the private /tmp. A command that `succeeds` on one (`rm
    -rf ../x` where `..` is an empty /tmp) changed nothing, and the model must be told."""
    if not confinement.confined:
        return []
    ws = os.path.realpath(workspace)
    found: dict[str, None] = {}
    for token in PATH_WORD.findall(command):
        token = token.rstrip(",")
        home = token.startswith("~")
        path = os.path.normpath(os.path.expanduser(token) if home else os.path.join(cwd, token))
        if _under(path, ws) or not os.path.lexists(path):
            continue
        if any(_under(path, h) for h in (*confinement.hidden, *PRIVATE)):
            found.setdefault(token, None)
    return list(found)[:3]


def describe(confinement: Confinement) -> str:
    """One line for status displays and heartbeats."""
    if confinement.unavailable:
        return f"bwrap required, unavailable: {confinement.unavailable}"
    return "bwrap" if confinement.confined else "none"
