"""Blocking Docker Engine API calls of the docker backend (run in its thread pool): exec with
capped, streamed output, and the file routes, run by commands inside the container."""

from __future__ import annotations

import asyncio
import io
import socket
import tarfile
import time
from typing import Any

from docker.utils.socket import consume_socket_output, demux_adaptor, frames_iter

from services.protocol.errors import PlatformError
from services.protocol.status import ErrorCode
from services.sandbox_broker.backends.base import OutputBuffer, OutputSink, bad_path
from services.sandbox_broker.backends.docker_config import RunAs


def run_exec(
    api: Any, container: str, argv: list[str], env: dict[str, str], workdir: str, user: str, limit: int,
    sink: OutputSink | None, loop: asyncio.AbstractEventLoop,
) -> tuple[int, OutputBuffer, OutputBuffer]:  # fmt: skip
    exec_id = api.exec_create(container, argv, environment=env, workdir=workdir, user=user)["Id"]
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


# The file routes run inside the container, in its own mount namespace: the view its commands and
# the reward have. Docker's archive API resolves paths on the engine's host-side mount of the
# container's root instead, which misses the container's own mounts (its tmpfs /tmp: a file put
# there was invisible to the container, and the reward's test patch with it) and answers 404 for
# every path once that host-side mount is gone while the container still runs. The first line
# marks each script as a rollout command, which the sweeps (docker_sweep.py) spare.
_MARK = "# rollout-exec: file transfer, spared by sweeps\n"
WRITE = _MARK + 'd=${1%/*}; if [ -n "$d" ]; then mkdir -p -- "$d" || exit 1; fi; cat > "$1"'
READ = _MARK + '[ -e "$1" ] || exit 2; [ -f "$1" ] || exit 3; exec cat -- "$1"'
PUT_TAR = _MARK + 'mkdir -p -- "$1" && exec tar -x -o -f - -C "$1"'
GET_TAR = _MARK + '[ -e "$1" ] || exit 2; [ -d "$1" ] || exit 3; exec tar -c -f - -C "$1" .'
MISSING, NOT_THAT_KIND = 2, 3
# exit codes that say the command never ran (the engine's or the runtime's failure, as "unable to
# find user", not the path's), or was killed (137, SIGKILL: seen under load on a private dockerd while
# writing the grader's plugin, with no output): an infra error, so that the caller retries, never a 400
CANNOT_RUN = (-1, 125, 126, 127, 137)


def _in_container(
    api: Any, container: str, run_as: RunAs, script: str, path: str, data: bytes | None = None
) -> tuple[int, bytes, str]:
    """Run ``script`` with ``path`` (made absolute) as ``$1`` and ``data`` on stdin; its exit code,
    stdout and stderr."""
    argv = ["sh", "-c", script, "rollout-file", run_as.absolute(path)]
    exec_id = api.exec_create(container, argv, stdin=data is not None, user=run_as.user)["Id"]
    sock = api.exec_start(exec_id, socket=True)
    try:
        if data is not None:
            raw = getattr(sock, "_sock", sock)
            raw.sendall(data)
            raw.shutdown(socket.SHUT_WR)  # end of stdin: the engine closes the command's stdin
        frames = (demux_adaptor(*frame) for frame in frames_iter(sock, tty=False))
        out, err = consume_socket_output(frames, demux=True)
    finally:
        sock.close()
    return _exit_code(api, exec_id), out or b"", (err or b"").decode(errors="replace").strip()


def _exit_code(api: Any, exec_id: str) -> int:
    """The exec's exit code (the engine may record it a moment after the output ended)."""
    deadline = time.monotonic() + 10
    while True:
        found = api.exec_inspect(exec_id)
        if found["ExitCode"] is not None and not found["Running"]:
            return int(found["ExitCode"])
        if time.monotonic() > deadline:
            return -1
        time.sleep(0.01)


def _checked(code: int, err: str, path: str, kind: str) -> None:
    if code == MISSING:
        raise PlatformError(ErrorCode.NOT_FOUND, f"not found in the sandbox: {path!r}")
    if code == NOT_THAT_KIND:
        raise bad_path(path, f"is not a {kind}")
    if code in CANNOT_RUN:
        message = f"the file command for {path!r} could not run in the sandbox (exit {code}): {err[-300:]}"
        raise PlatformError(ErrorCode.TRANSPORT_ERROR, message)
    if code != 0:
        raise bad_path(path, err[-300:] or f"exited {code}")


def write_file(api: Any, container: str, run_as: RunAs, path: str, data: bytes) -> None:
    code, _, err = _in_container(api, container, run_as, WRITE, path, data)
    _checked(code, err, path, "regular file")


def read_file(api: Any, container: str, run_as: RunAs, path: str) -> bytes:
    code, out, err = _in_container(api, container, run_as, READ, path)
    _checked(code, err, path, "regular file")
    return out


def put_archive(api: Any, container: str, run_as: RunAs, directory: str, tar: bytes) -> None:
    _check_tar(tar)
    code, _, err = _in_container(api, container, run_as, PUT_TAR, directory, tar)
    _checked(code, err, directory, "directory")


def get_archive(api: Any, container: str, run_as: RunAs, directory: str) -> bytes:
    """The directory as a tar with names relative to it (``./...``), like the local backend's."""
    code, out, err = _in_container(api, container, run_as, GET_TAR, directory)
    _checked(code, err, directory, "directory")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(out)) as source, tarfile.open(fileobj=buffer, mode="w") as result:
        for member in source.getmembers():
            name = member.name.rstrip("/").removeprefix("./")
            member.name = f"./{name}" if name not in ("", ".") else "."
            result.addfile(member, source.extractfile(member) if member.isfile() else None)
    return buffer.getvalue()


def _check_tar(tar: bytes) -> None:
    try:
        with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
            for member in archive.getmembers():
                if member.name.startswith("/") or ".." in member.name.split("/"):
                    raise bad_path(member.name, "archive member leaves the directory")
    except tarfile.TarError as exc:
        raise PlatformError(ErrorCode.BAD_REQUEST, f"bad tar archive: {exc}", field="body") from exc
