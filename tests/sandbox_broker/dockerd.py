"""A private dockerd for the docker backend's tests (services/runtime/dockerd.py) with a locally
imported busybox image as the default sandbox image."""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import tarfile
from collections.abc import Iterator

import docker

from services.runtime.dockerd import Dockerd
from services.runtime.dockerd import private_dockerd as _private_dockerd

IMAGE = "rollout/sandbox:test"

__all__ = ["IMAGE", "Dockerd", "private_dockerd", "runsc_problem"]


def _busybox_image(files: dict[str, tuple[bytes | None, int]] | None = None) -> bytes:
    """A root filesystem of busybox and its applets, as the tar ``docker import`` takes, with
    ``files`` added (path -> (content, owner's uid); content None: a directory)."""
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
        for path, (content, uid) in (files or {}).items():
            info = tarfile.TarInfo(path)
            info.uid = info.gid = uid
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            info.size = len(content or b"")
            archive.addfile(info, io.BytesIO(content) if content is not None else None)
    return buffer.getvalue()


def import_image(client: docker.DockerClient, tag: str, files: dict[str, tuple[bytes | None, int]],
                 changes: list[str]) -> None:  # fmt: skip
    """The busybox image with ``files`` and Dockerfile ``changes`` (USER, WORKDIR, ENV) as ``tag``."""
    repository, _, version = tag.partition(":")
    client.api.import_image_from_data(_busybox_image(files), repository=repository, tag=version, changes=changes)


def _import_busybox(client: docker.DockerClient) -> None:
    client.api.import_image_from_data(_busybox_image(), repository=IMAGE.split(":")[0], tag=IMAGE.split(":")[1])


@contextlib.contextmanager
def private_dockerd(*, btrfs_mb: int = 0, runtimes: dict[str, list[str]] | None = None) -> Iterator[Dockerd | str]:
    """Yield a running dockerd with the busybox image, or the reason it cannot run here (the caller
    skips); ``btrfs_mb`` and ``runtimes`` as services/runtime/dockerd.py takes them."""
    if shutil.which("busybox") is None:
        yield "busybox is needed (apt-get install busybox-static)"
        return
    with _private_dockerd(_import_busybox, btrfs_mb=btrfs_mb, runtimes=runtimes) as found:
        yield found


def runsc_problem() -> str:
    """ "" where gVisor runs a sandbox on this host, else why not (the caller skips): not installed,
    or its platform refused (ptrace not allowed, say)."""
    runsc = shutil.which("runsc")
    if runsc is None:
        return "runsc is needed (apt-get install runsc)"
    done = subprocess.run([runsc, "--network=none", "do", "true"], capture_output=True, text=True, cwd="/tmp",
                          timeout=60, check=False)  # fmt: skip
    return "" if done.returncode == 0 else f"runsc cannot run here: {done.stderr.strip()[-300:]}"
