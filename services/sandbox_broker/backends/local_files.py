"""A local sandbox's files as the broker reads and writes them on the host: only under its writable
directories (or its image root), never through a link, a full disk quota reported as 413, tar archives in and out."""

from __future__ import annotations

import errno
import io
import os
import posixpath
import tarfile
from pathlib import Path

from services.protocol.errors import PlatformError
from services.protocol.status import ErrorCode
from services.sandbox_broker.backends import imageroot, local_prepare
from services.sandbox_broker.backends.base import bad_path
from services.sandbox_broker.backends.bwrap import SandboxPaths
from services.sandbox_broker.backends.local_images import image_of, read_meta

WORKDIR = "/workspace"
WRITABLE = ("/workspace", "/tmp")


def host_path(paths: SandboxPaths, path: str) -> Path:
    """The host path behind a sandbox path under /workspace or /tmp (anywhere in an image root),
    refusing links that leave it."""
    image = image_of(read_meta(paths))
    if image is not None:
        return imageroot.host_path(paths, image, path)
    inside = posixpath.normpath(posixpath.join(WORKDIR, path))
    for top, base in zip(WRITABLE, (paths.workspace, paths.tmp), strict=True):
        if inside == top or inside.startswith(top + "/"):
            host = base / inside[len(top) :].lstrip("/")
            real, real_base = os.path.realpath(host), os.path.realpath(base)
            if real != real_base and not real.startswith(real_base + "/"):
                raise bad_path(path, "resolves outside the sandbox")
            return Path(real)
    raise bad_path(path, "only paths under /workspace and /tmp can be read or written")


def write_owned(paths: SandboxPaths, host: Path, data: bytes, uid: int) -> None:
    """Write ``host`` (in the sandbox at ``paths``), the directories made for it and it owned by ``uid``."""
    made = [p for p in host.parents if not p.exists() and p.is_relative_to(paths.root)]
    host.parent.mkdir(parents=True, exist_ok=True)
    for directory in made:
        local_prepare.own(directory, uid)
    write_host_file(host, data)
    local_prepare.own(host, uid)


def write_host_file(host: Path, data: bytes) -> None:
    fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise PlatformError(ErrorCode.PAYLOAD_TOO_LARGE, "the sandbox's disk quota is full",
                                field="body") from exc  # fmt: skip
        raise


def read_host_file(host: Path) -> bytes:
    fd = os.open(host, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def extract_tar(host: Path, tar: bytes) -> None:
    host.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
            archive.extractall(host, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise PlatformError(ErrorCode.BAD_REQUEST, f"bad tar archive: {exc}", field="body") from exc


def pack_tar(host: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(host, arcname=".")
    return buffer.getvalue()
