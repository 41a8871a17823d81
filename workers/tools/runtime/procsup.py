"""The supervisor of one background process started by the `process` tool.

It runs detached from the worker (its own session), so the process lives with its job's
session, not with the worker process that started it. It feeds the command's stdin from a
FIFO, keeps at most `cap` bytes of its output (older output is dropped and counted), and
records the exit code. Its whole state is a directory any worker on the host can read.
Its output also goes, as it comes, to the job that started it (`process_live`).
With the sandbox on, the command runs in the session's container through an attached
exec, and the same directory holds where it runs.

    python -m workers.tools.runtime.procsup DIR CAP  (DIR holds `cmd`, `cwd` and the host `argv`, or
    for the sandbox `sandbox_key` and `workspace`)

Under bubblewrap the recorded pid is that of the command's PID namespace's first process
(bubblewrap reports it on `--info-fd`): it leads the command's process group, so a signal
to the group reaches the command's tree, and SIGKILL ends the whole namespace.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from workers.tools.runtime.live_output import LiveOutput
from workers.tools.runtime.process_live import feed, tell

CHUNK = 65536
INFO_FD = 63  # where bubblewrap writes the pid of the command's namespace (see argv)


@contextmanager
def output_locked(state: Path) -> Iterator[None]:
    """Held while the output and the count of what it dropped change, and while a reader
    reads them: it sees them as one state (a trim replaces the file, then counts)."""
    with open(state / "lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released as the file closes
        yield


class Sink:
    """Appends output to `out`, keeping the newest `cap` bytes; offsets stay absolute."""

    def __init__(self, state: Path, cap: int) -> None:
        self.state, self.cap = state, cap
        self.out = state / "out"
        self.out.touch()
        self.kept = self.dropped = 0

    def write(self, chunk: bytes) -> None:
        with output_locked(self.state):
            with self.out.open("ab") as fh:
                fh.write(chunk)
            self.kept += len(chunk)
            if self.kept > self.cap:
                data = self.out.read_bytes()[self.kept - self.cap :]
                self.dropped += self.kept - self.cap
                self.kept = self.cap
                tmp = self.state / "out.tmp"
                tmp.write_bytes(data)
                os.replace(tmp, self.out)
                (self.state / "dropped").write_text(str(self.dropped))


def supervise(state: Path, cap: int) -> int:
    live = feed(state)  # first: the Redis URL and the secrets leave the environment
    fifo = state / "in"
    os.mkfifo(fifo, 0o600)
    stdin = os.open(fifo, os.O_RDWR)  # read and write ends: the process never sees EOF
    sink = Sink(state, cap)
    if (state / "sandbox_key").exists():
        code = _in_sandbox(state, stdin, sink, live)
    else:
        code = _on_host(state, stdin, sink, live)
    (state / "code").write_text(str(code))
    if live is not None:
        live.close()  # after the code: a Redis that hangs delays nothing that counts
    return code


def _on_host(state: Path, stdin: int, sink: Sink, live: LiveOutput | None) -> int:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "HOME")}
    argv = json.loads((state / "argv").read_text())
    reports = "--info-fd" in argv
    if reports:
        info, write_end = os.pipe()
        os.dup2(write_end, INFO_FD)
        os.close(write_end)
    proc = subprocess.Popen(
        argv,
        cwd=(state / "cwd").read_text(),
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        pass_fds=(INFO_FD,) if reports else (),
    )
    os.close(stdin)
    pid = proc.pid
    if reports:
        os.close(INFO_FD)
        pid = _namespace_pid(info) or pid
    (state / "pid").write_text(str(pid))
    assert proc.stdout is not None
    while chunk := proc.stdout.read1(CHUNK):  # type: ignore[attr-defined]
        sink.write(chunk)
        tell(live, "stdout", chunk)  # stderr joins stdout here
    return proc.wait()


def _namespace_pid(info: int) -> int | None:
    """bubblewrap's `child-pid` from its info fd; None if it failed before reporting."""
    data = b""
    with os.fdopen(info, "rb") as stream:
        while chunk := stream.read1(4096):
            data += chunk
            try:
                return int(json.loads(data)["child-pid"])
            except (ValueError, KeyError):
                continue
    return None


def _in_sandbox(state: Path, stdin: int, sink: Sink, live: LiveOutput | None) -> int:
    from docker.utils.socket import frames_iter

    from broker.config.settings import Settings
    from workers.confine.sandbox import STDERR, Sandbox, SandboxError, _close

    sandbox = Sandbox(Settings.model_validate_json((state / "sandbox.json").read_text()))
    try:
        attached = sandbox.attach(
            (state / "sandbox_key").read_text(),
            (state / "workspace").read_text(),
            (state / "cmd").read_text(),
            (state / "cwd").read_text(),
            {"HOME": "/tmp"},
            stdin=True,
        )
    except SandboxError as exc:
        sink.write(f"[sandbox error, not started: {exc}]\n".encode())
        return 126
    (state / "container").write_text(attached.container.name)
    (state / "pidfile").write_text(attached.pidfile)
    (state / "pid").write_text("sandbox")
    raw = getattr(attached.sock, "_sock", attached.sock)

    def pump() -> None:  # our FIFO → the command's stdin
        while data := os.read(stdin, CHUNK):
            raw.sendall(data)

    threading.Thread(target=pump, daemon=True).start()
    frames: Iterable[tuple[int, bytes]] = frames_iter(attached.sock, tty=False)
    for stream_id, chunk in frames:
        sink.write(chunk)
        tell(live, "stderr" if stream_id == STDERR else "stdout", chunk)
    _close(attached.sock)
    code = sandbox.exit_code(attached.exec_id)
    sandbox.close()
    return code if code is not None else 1


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1]), int(sys.argv[2])))
