"""A Docker-API engine for the sandbox tests: the one configured (DOCKER_HOST), else a
podman service this module starts (the CI machine has podman, not Docker), and a minimal
sandbox image built from busybox-static, since no registry can be reached."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

IMAGE = "localhost/clawq-sandbox:latest"
SOCKET = "/run/podman/clawq-tests.sock"
APPLETS = [
    "sh",
    "ls",
    "cat",
    "echo",
    "sleep",
    "id",
    "wc",
    "env",
    "rm",
    "touch",
    "mkdir",
    "ps",
    "kill",
    "head",
    "tail",
    "grep",
    "true",
    "false",
    "pwd",
    "wget",
    "hostname",
    "seq",
    "pgrep",
    "pkill",
    "printf",
    "uname",
    "test",
    "[",
]


class EngineUnavailable(Exception):
    pass


_SERVICE: subprocess.Popen[bytes] | None = None  # the podman service this module started; it
# outlives the tests (later runs reuse it), so it is held here rather than collected as running


def docker_url() -> str:
    """A reachable Docker API URL, starting podman's service if needed."""
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    url = f"unix://{SOCKET}"
    if _reachable(url):
        return url
    if not shutil.which("podman"):
        raise EngineUnavailable("no DOCKER_HOST and no podman (see .ci/run for the setup)")
    Path(SOCKET).parent.mkdir(parents=True, exist_ok=True)
    global _SERVICE
    _SERVICE = subprocess.Popen(
        ["podman", "system", "service", "--time=0", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        # not the checkout's directory: the service outlives this run, and once a clone it
        # was started in is deleted, runc fails in it ("write child: broken pipe")
        cwd="/",
    )
    for _ in range(100):
        if _reachable(url):
            return url
        time.sleep(0.1)
    raise EngineUnavailable(f"podman service did not answer on {url}")


def _reachable(url: str) -> bool:
    """The engine answers a ping. A unix socket is first probed by hand: docker-py leaves
    a socket unclosed when the engine is not listening yet."""
    import docker

    if url.startswith("unix://"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(url.removeprefix("unix://"))
            except OSError:
                return False
    try:
        client = docker.DockerClient(base_url=url, timeout=5)
    except Exception:  # the constructor asks the engine for its API version
        return False
    try:
        client.ping()
        return True
    except Exception:
        return False
    finally:
        client.close()


def ensure_image(url: str) -> str:
    """The busybox sandbox image, imported once from a root filesystem made here."""
    import docker

    client = docker.DockerClient(base_url=url)
    try:
        return _ensure_image(client)
    finally:
        client.close()


def _ensure_image(client: Any) -> str:
    import docker

    try:
        client.images.get(IMAGE)
        return IMAGE
    except docker.errors.ImageNotFound:
        pass
    busybox = shutil.which("busybox")
    if not busybox:
        raise EngineUnavailable("busybox-static is needed to build the sandbox image")
    with tempfile.TemporaryDirectory() as root:
        for sub in ("bin", "tmp", "workspace", "etc", "proc", "dev", "sys"):
            os.makedirs(os.path.join(root, sub))
        os.chmod(os.path.join(root, "tmp"), 0o1777)
        shutil.copy(busybox, os.path.join(root, "bin", "busybox"))
        for applet in APPLETS:
            os.symlink("busybox", os.path.join(root, "bin", applet))
        Path(root, "etc", "passwd").write_text(
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"
        )
        Path(root, "etc", "group").write_text("root:x:0:\nnogroup:x:65534:\n")
        archive = os.path.join(root, "..", f"rootfs-{os.getpid()}.tar")
        with tarfile.open(archive, "w") as tar:
            tar.add(root, arcname=".")
        try:
            with open(archive, "rb") as fh:
                client.api.import_image_from_data(
                    fh.read(),
                    repository="localhost/clawq-sandbox",
                    tag="latest",
                    changes=["ENV PATH=/bin"],
                )
        finally:
            os.unlink(archive)
    client.images.get(IMAGE)
    return IMAGE
