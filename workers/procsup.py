"""The supervisor of one background process started by the `process` tool.

It runs detached from the worker (its own session), so the process lives with its job's
session, not with the worker process that started it. It feeds the command's stdin from a
FIFO, keeps at most `cap` bytes of its output (older output is dropped and counted), and
records the exit code. Its whole state is a directory any worker on the host can read.

    python -m workers.procsup DIR CAP  (DIR holds `cmd` and `cwd`)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHUNK = 65536


def supervise(state: Path, cap: int) -> int:
    command = (state / "cmd").read_text()
    cwd = (state / "cwd").read_text()
    fifo = state / "in"
    os.mkfifo(fifo, 0o600)
    stdin = os.open(fifo, os.O_RDWR)  # read and write ends: the process never sees EOF
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "HOME")}
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command],
        cwd=cwd,
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    os.close(stdin)
    (state / "pid").write_text(str(proc.pid))
    out = state / "out"
    out.touch()
    kept, dropped = 0, 0
    assert proc.stdout is not None
    while chunk := proc.stdout.read1(CHUNK):  # type: ignore[attr-defined]
        with out.open("ab") as fh:
            fh.write(chunk)
        kept += len(chunk)
        if kept > cap:  # keep the newest `cap` bytes; the offsets stay absolute
            data = out.read_bytes()[kept - cap :]
            dropped += kept - cap
            kept = cap
            tmp = state / "out.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, out)
            (state / "dropped").write_text(str(dropped))
    code = proc.wait()
    (state / "code").write_text(str(code))
    return code


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1]), int(sys.argv[2])))
