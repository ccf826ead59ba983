"""A private dockerd for the docker backend's tests: its own socket, data and exec roots, no default
bridge and no iptables rules, a locally imported busybox image; everything removed afterwards."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

IMAGE = "rollout/sandbox:test"


@dataclass
class Dockerd:
    root: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"unix://{self.root}/docker.sock"

    @property
    def exec_root(self) -> str:
        return str(self.root / "exec")


def _busybox_image() -> bytes:
    """A root filesystem of busybox and its applets, as the tar ``docker import`` takes."""
    busybox = shutil.which("busybox")
    assert busybox is not None
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for directory in ("bin", "tmp", "workspace", "etc"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            archive.addfile(info)
        archive.add(busybox, "bin/busybox")
        for applet in applets:
            if applet != "busybox":
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type, link.linkname = tarfile.SYMTYPE, "busybox"
                archive.addfile(link)
    return buffer.getvalue()


def _mounts_under(root: Path) -> list[str]:
    with open("/proc/mounts") as mounts:
        return [line.split()[1] for line in mounts if line.split()[1].startswith(str(root))]


@contextlib.contextmanager
def private_dockerd() -> Iterator[Dockerd | str]:
    """Yield a running dockerd, or the reason it cannot run here (the caller skips)."""
    binary = shutil.which("dockerd")
    if binary is None or shutil.which("busybox") is None or os.geteuid() != 0:
        yield "dockerd, busybox and root are needed (apt-get install docker.io busybox-static)"
        return
    root = Path(tempfile.mkdtemp(prefix="rollout-dockerd-"))
    log = (root / "dockerd.log").open("wb")
    argv = [binary, "--data-root", f"{root}/data", "--exec-root", f"{root}/exec", "--pidfile", f"{root}/dockerd.pid",
            "-H", f"unix://{root}/docker.sock", "--bridge=none", "--iptables=false", "--ip-masq=false"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    daemon = Dockerd(root, proc)
    try:
        reason = _wait_ready(daemon)
        if reason:
            yield reason
            return
        client = docker.DockerClient(base_url=daemon.url)
        client.api.import_image_from_data(_busybox_image(), repository=IMAGE.split(":")[0], tag=IMAGE.split(":")[1])
        client.close()
        yield daemon
    finally:
        _stop(daemon)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def _wait_ready(daemon: Dockerd) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if daemon.proc.poll() is not None:
            return f"dockerd exited: {(daemon.root / 'dockerd.log').read_text()[-500:]}"
        if (daemon.root / "docker.sock").exists():
            try:  # a loaded machine may answer the version query late: retry until the deadline
                client = docker.DockerClient(base_url=daemon.url, timeout=5)
            except docker.errors.DockerException:
                time.sleep(0.1)
                continue
            try:
                if client.ping():
                    return ""
            except docker.errors.DockerException:
                pass
            finally:
                client.close()
        time.sleep(0.1)
    return "dockerd did not answer within 120 s"


def _stop(daemon: Dockerd) -> None:
    """Remove containers and networks, stop dockerd and its containerd, delete bridges and mounts."""
    bridges: list[str] = []
    if daemon.proc.poll() is None:
        with contextlib.suppress(Exception):
            client = docker.DockerClient(base_url=daemon.url, timeout=30)
            for container in client.containers.list(all=True):
                container.remove(force=True)
            for network in client.networks.list():
                if network.name not in ("none", "host", "bridge"):
                    bridges.append(f"br-{network.id[:12]}")
                    network.remove()
            client.close()
        os.killpg(daemon.proc.pid, signal.SIGTERM)
        try:
            daemon.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.proc.pid, signal.SIGKILL)
            daemon.proc.wait(timeout=10)
    for bridge in bridges:
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)
    for mount in sorted(_mounts_under(daemon.root), reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
