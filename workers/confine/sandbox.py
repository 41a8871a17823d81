"""The Docker sandbox for exec: a container per sandbox key (session or agent).

The workspace is mounted at /workspace; there is no network by default; memory, CPU and
process limits hold; commands run as a non-root user. A key's container is reused by
every call and every worker process (found by name), and removed once idle. Every error
is a `SandboxError` and fails the call: nothing falls back to the host.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.config.settings import Settings
from broker.errors import RunError

WORKDIR = "/workspace"
STDERR = 2
KEEPALIVE = ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600; done"]
LABEL = "clawq.sandbox"
# Each command runs in its own process group (an exec'd process leads one); its pid is
# written first so that a timeout can kill the whole group from a second exec.
WRAPPER = 'echo $$ > "$0"; exec sh -c "$1"'


class SandboxError(RunError):
    """The sandbox could not run the command; the call fails (no fallback to the host)."""


@dataclass
class Attached:
    container: Any
    pidfile: str  # inside the container; holds the command's process group id
    exec_id: str
    sock: Any


@dataclass
class SandboxRun:
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    truncated: bool
    timed_out: bool
    container: str
    cancelled: str | None = None


def _close(sock: Any) -> None:
    """Close an attached exec socket, and the socket under docker-py's SocketIO wrapper."""
    raw = getattr(sock, "_sock", None)
    sock.close()
    if raw is not None:
        raw.close()


def container_name(key: str, workspace: str) -> str:
    digest = hashlib.sha256(f"{key}\0{workspace}".encode()).hexdigest()[:20]
    return f"clawq-sbx-{digest}"


class Sandbox:
    """One worker process's handle on the Docker API."""

    def __init__(self, settings: Settings, on_use: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self.on_use = on_use  # told each container name as it is used (idle tracking)
        self._client: Any = None
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        if self._client is None:
            import docker

            url = self.settings.sandbox_docker_url or os.environ.get("DOCKER_HOST", "")
            if url.startswith("unix://") and not os.path.exists(url[len("unix://") :]):
                raise SandboxError(f"no Docker API socket at {url}")
            try:
                self._client = (
                    docker.DockerClient(base_url=self.settings.sandbox_docker_url)
                    if self.settings.sandbox_docker_url
                    else docker.from_env()
                )
            except docker.errors.DockerException as exc:
                raise SandboxError(f"cannot reach the Docker API: {exc}") from exc
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def user_for(self, workspace: str) -> str:
        if self.settings.sandbox_user:
            return self.settings.sandbox_user
        st = os.stat(workspace)
        return f"{st.st_uid}:{st.st_gid}" if st.st_uid != 0 else "65534:65534"

    def container(self, key: str, workspace: str) -> Any:
        """The running container of this key and workspace, created if needed."""
        import docker

        name = container_name(key, workspace)
        s = self.settings
        with self._lock:
            try:
                found = self.client.containers.get(name)
                if found.status != "running":
                    found.start()
                return found
            except docker.errors.NotFound:
                pass
            except docker.errors.DockerException as exc:
                raise SandboxError(f"sandbox {name}: {exc}") from exc
            try:  # create + start: `run` would try to pull a missing image
                created = self.client.containers.create(
                    s.sandbox_image,
                    KEEPALIVE,
                    name=name,
                    user=self.user_for(workspace),
                    network_mode=s.sandbox_network,
                    mem_limit=s.sandbox_memory,
                    nano_cpus=int(s.sandbox_cpus * 1e9),
                    pids_limit=s.sandbox_pids,
                    volumes={workspace: {"bind": WORKDIR, "mode": "rw"}},
                    working_dir=WORKDIR,
                    tmpfs={"/tmp": "rw,size=64m,mode=1777"},
                    cap_drop=["ALL"],
                    security_opt=["no-new-privileges"],
                    labels={LABEL: key, "clawq.workspace": workspace},
                )
                created.start()
                return created
            except docker.errors.ImageNotFound as exc:
                raise SandboxError(
                    f"sandbox image {s.sandbox_image} not found: build or pull it first"
                ) from exc
            except docker.errors.APIError as exc:
                if exc.status_code == 409:  # another process created it first
                    return self.client.containers.get(name)
                raise SandboxError(f"cannot start sandbox {name}: {exc.explanation}") from exc
            except docker.errors.DockerException as exc:
                raise SandboxError(f"cannot start sandbox {name}: {exc}") from exc

    def run(
        self,
        key: str,
        workspace: str,
        command: str,
        cwd: str,
        timeout: float,
        cap: int,
        env: dict[str, str],
        cancelled: Callable[[], str | None] = lambda: None,
        heard: Callable[[str, bytes], None] | None = None,
    ) -> SandboxRun:
        """Run `command` in the key's container; kill its process group on timeout.
        `heard` is told each piece of output as it is read (`stdout` or `stderr`, its
        bytes), before the cap: the attach stream is read as it comes, never at the end."""
        from docker.utils.socket import frames_iter

        attached = self.attach(key, workspace, command, cwd, env)
        ctr, pidfile, exec_id, sock = (
            attached.container,
            attached.pidfile,
            attached.exec_id,
            attached.sock,
        )
        out, err = bytearray(), bytearray()
        state = {"truncated": False}

        def drain() -> None:
            try:
                for stream_id, chunk in frames_iter(sock, tty=False):
                    buf = err if stream_id == STDERR else out
                    if heard is not None:
                        heard("stderr" if stream_id == STDERR else "stdout", chunk)
                    room = cap - len(buf)
                    buf += chunk[: max(room, 0)]
                    state["truncated"] |= len(chunk) > room
            finally:
                _close(sock)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout
        stopped = None
        while reader.is_alive() and time.monotonic() < deadline:
            reader.join(min(0.2, max(deadline - time.monotonic(), 0.01)))
            if reader.is_alive() and (stopped := cancelled()):
                break
        timed_out = reader.is_alive() and not stopped
        if reader.is_alive():
            self._kill_group(ctr, pidfile)
            reader.join(5)
        code = self.exit_code(exec_id)
        return SandboxRun(
            None if timed_out or stopped else code,
            bytes(out),
            bytes(err),
            state["truncated"],
            timed_out,
            ctr.name,
            stopped,
        )

    def attach(
        self,
        key: str,
        workspace: str,
        command: str,
        cwd: str,
        env: dict[str, str],
        stdin: bool = False,
    ) -> Attached:
        """Start `command` in the key's container in its own process group, attached."""
        import docker

        ctr = self.container(key, workspace)
        if self.on_use:
            self.on_use(ctr.name)
        rel = os.path.relpath(cwd, workspace)
        workdir = WORKDIR if rel == "." else f"{WORKDIR}/{rel}"
        pidfile = f"/tmp/.clawq-{uuid.uuid4().hex}.pid"
        api = self.client.api
        try:
            exec_id = api.exec_create(
                ctr.id,
                ["sh", "-c", WRAPPER, pidfile, command],
                workdir=workdir,
                environment=env,
                user=self.user_for(workspace),
                stdin=stdin,
            )["Id"]
            sock = api.exec_start(exec_id, socket=True)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"sandbox exec failed: {exc}") from exc
        return Attached(ctr, pidfile, exec_id, sock)

    def exit_code(self, exec_id: str) -> int | None:
        import docker

        try:
            code = self.client.api.exec_inspect(exec_id).get("ExitCode")
        except docker.errors.DockerException:
            return None
        return int(code) if code is not None else None

    def signal_group(self, container: str, pidfile: str, signal: str) -> None:
        """Send `signal` (e.g. KILL, TERM) to a command's whole process group."""
        import docker

        try:
            ctr = self.client.containers.get(container)
            ctr.exec_run(["sh", "-c", f'kill -{signal} -"$(cat {pidfile})"'])
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot signal in sandbox {container}: {exc}") from exc

    def _kill_group(self, ctr: Any, pidfile: str) -> None:
        ctr.exec_run(["sh", "-c", f'kill -9 -"$(cat {pidfile})"; rm -f {pidfile}'])

    def reap(self, in_use: Callable[[str], bool]) -> list[str]:
        """Remove sandbox containers no worker has used lately; returns their names."""
        import docker

        removed = []
        try:
            for ctr in self.client.containers.list(all=True, filters={"label": LABEL}):
                if not in_use(ctr.name):
                    ctr.remove(force=True)
                    removed.append(ctr.name)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"sandbox cleanup failed: {exc}") from exc
        return removed
