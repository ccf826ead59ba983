"""A local sandbox's files as the broker reads and writes them on the host: never through a link,
a full disk quota reported as 413, tar archives in and out."""

from __future__ import annotations

import errno
import io
import os
import tarfile
from pathlib import Path

from services.protocol.errors import PlatformError
from services.protocol.status import ErrorCode


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
