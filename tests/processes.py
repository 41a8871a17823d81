"""Finding the host processes a test started, by a token in their command line (a pid
printed from inside a confined command is its PID namespace's, not the host's)."""

from __future__ import annotations

import os
import time
import uuid


def token() -> str:
    """A `sleep` argument no other process has: `sleep 30.<digits>` sleeps ~30 s."""
    return f"30.{uuid.uuid4().int % 10**9:09d}"


def pids_with(needle: str) -> list[int]:
    """Live processes whose command line contains `needle` (zombies excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmdline and state != "Z" and int(entry) != os.getpid():
            found.append(int(entry))
    return found


def wait_for_pids(needle: str, count: int = 1, seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if len(found := pids_with(needle)) >= count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} processes with {needle!r} after {seconds}s")


def gone_within(needle: str, seconds: float) -> float:
    """How long until no process has `needle`; fails if one is still there after `seconds`."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if not pids_with(needle):
            return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError(f"processes with {needle!r} still alive after {seconds}s")
