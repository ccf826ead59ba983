"""A private dockerd (Debian's docker.io): its own socket, data and exec roots, no default bridge
and no iptables rules of its own; on exit its containers and networks are removed, the daemon and
its containerd stopped, its bridges and mounts deleted. For tests and benchmarks on a host where
no engine runs (or one must not be touched)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors


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


def mounts_under(root: Path) -> list[str]:
    with open("/proc/mounts") as mounts:
        return [line.split()[1] for line in mounts if line.split()[1].startswith(str(root))]


@contextlib.contextmanager
def private_dockerd(
    prepare: Callable[[docker.DockerClient], None] | None = None, *, btrfs_mb: int = 0,
    runtimes: dict[str, list[str]] | None = None,
) -> Iterator[Dockerd | str]:  # fmt: skip
    """Yield a running dockerd (after ``prepare`` ran against it), or the reason it cannot run here.
    ``btrfs_mb``: its data root on a loop-mounted btrfs of that size, with the btrfs storage
    driver (per-container size limits); ``runtimes``: OCI runtimes it offers (name -> the binary
    and its arguments: ``{"runsc": ["/usr/bin/runsc", "--network=none"]}``)."""
    binary = shutil.which("dockerd")
    if binary is None or os.geteuid() != 0:
        yield "dockerd and root are needed (apt-get install docker.io)"
        return
    if btrfs_mb and shutil.which("mkfs.btrfs") is None:
        yield "mkfs.btrfs is needed for a btrfs data root (apt-get install btrfs-progs)"
        return
    root = Path(tempfile.mkdtemp(prefix="rollout-dockerd-"))
    log = (root / "dockerd.log").open("wb")
    argv = [binary, "--data-root", f"{root}/data", "--exec-root", f"{root}/exec", "--pidfile", f"{root}/dockerd.pid",
            "-H", f"unix://{root}/docker.sock", "--bridge=none", "--iptables=false", "--ip-masq=false"]  # fmt: skip
    if runtimes:
        config = {"runtimes": {name: {"path": argv[0], "runtimeArgs": argv[1:]} for name, argv in runtimes.items()}}
        (root / "daemon.json").write_text(json.dumps(config))
        argv.append(f"--config-file={root}/daemon.json")
    if btrfs_mb:
        reason = _btrfs(root, btrfs_mb)
        if reason:
            shutil.rmtree(root, ignore_errors=True)
            yield reason
            return
        argv.append("--storage-driver=btrfs")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    daemon = Dockerd(root, proc)
    try:
        reason = _wait_ready(daemon)
        if reason:
            yield reason
            return
        if prepare is not None:
            client = docker.DockerClient(base_url=daemon.url)
            try:
                prepare(client)
            finally:
                client.close()
        yield daemon
    finally:
        _stop(daemon)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def _btrfs(root: Path, size_mb: int) -> str:
    """A sparse btrfs image loop-mounted on ``root/data``; "" or why it failed."""
    image, data = root / "data.btrfs", root / "data"
    data.mkdir()
    with image.open("wb") as f:
        f.truncate(size_mb << 20)
    for argv in (["mkfs.btrfs", "-q", str(image)], ["mount", "-o", "loop", str(image), str(data)]):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return f"{' '.join(argv[:2])} failed: {done.stderr.strip()[-300:]}"
    return ""


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
    for mount in sorted(mounts_under(daemon.root), reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
