"""Blocking Docker Engine API calls of the docker backend (run in its thread pool): exec with
capped, streamed output, and files moved as tar archives."""

from __future__ import annotations

import asyncio
import io
import posixpath
import tarfile
from typing import Any

from services.protocol.errors import PlatformError
from services.protocol.status import ErrorCode
from services.sandbox_broker.backends.base import OutputBuffer, OutputSink, bad_path

WORKDIR = "/workspace"


def run_exec(
    api: Any, container: str, argv: list[str], env: dict[str, str], workdir: str, limit: int,
    sink: OutputSink | None, loop: asyncio.AbstractEventLoop,
) -> tuple[int, OutputBuffer, OutputBuffer]:  # fmt: skip
    exec_id = api.exec_create(container, argv, environment=env, workdir=workdir)["Id"]
    out, err = OutputBuffer(limit), OutputBuffer(limit)
    for chunk_out, chunk_err in api.exec_start(exec_id, stream=True, demux=True):
        for name, chunk, buffer in (("stdout", chunk_out, out), ("stderr", chunk_err, err)):
            if chunk:
                buffer.add(chunk)
                if sink is not None:
                    asyncio.run_coroutine_threadsafe(_deliver(sink, name, chunk), loop)
    code = api.exec_inspect(exec_id)["ExitCode"]
    return int(code if code is not None else -1), out, err


async def _deliver(sink: OutputSink, name: str, chunk: bytes) -> None:
    await sink(name, chunk)


def absolute(path: str) -> str:
    return posixpath.normpath(posixpath.join(WORKDIR, path))


def _mkdir(api: Any, container: str, directory: str) -> None:
    argv = ["sh", "-c", '# rollout-exec: spared by sweeps (docker_sweep.py)\nmkdir -p "$1"', "mkdir", directory]
    exec_id = api.exec_create(container, argv)["Id"]
    api.exec_start(exec_id)
    if api.exec_inspect(exec_id)["ExitCode"] != 0:
        raise bad_path(directory, "cannot create the directory")


def write_file(api: Any, container: str, path: str, data: bytes) -> None:
    target = absolute(path)
    directory, name = posixpath.split(target)
    _mkdir(api, container, directory)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o644
        archive.addfile(info, io.BytesIO(data))
    api.put_archive(container, directory, buffer.getvalue())


def read_file(api: Any, container: str, path: str) -> bytes:
    stream, _ = api.get_archive(container, absolute(path))
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
        member = archive.next()
        if member is None or not member.isfile():
            raise bad_path(path, "is not a regular file")
        extracted = archive.extractfile(member)
        assert extracted is not None
        return extracted.read()


def put_archive(api: Any, container: str, directory: str, tar: bytes) -> None:
    target = absolute(directory)
    _check_tar(tar)
    _mkdir(api, container, target)
    api.put_archive(container, target, tar)


def get_archive(api: Any, container: str, directory: str) -> bytes:
    """The directory as a tar with names relative to it (``./...``), like the local backend's."""
    stream, _ = api.get_archive(container, absolute(directory).rstrip("/") + "/.")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as source, tarfile.open(fileobj=buffer, mode="w") as out:
        for member in source.getmembers():
            parts = member.name.split("/", 1)
            member.name = "./" + parts[1] if len(parts) > 1 and parts[1] else "."
            out.addfile(member, source.extractfile(member) if member.isfile() else None)
    return buffer.getvalue()


def _check_tar(tar: bytes) -> None:
    try:
        with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
            for member in archive.getmembers():
                if member.name.startswith("/") or ".." in member.name.split("/"):
                    raise bad_path(member.name, "archive member leaves the directory")
    except tarfile.TarError as exc:
        raise PlatformError(ErrorCode.BAD_REQUEST, f"bad tar archive: {exc}", field="body") from exc
