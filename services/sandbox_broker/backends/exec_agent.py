"""The exec agent: one long-lived process inside each local sandbox that runs its commands.

The broker starts it once per sandbox, as bubblewrap's command (the same namespaces, uid, limits and
cgroups a per-command bubblewrap had), and sends it requests over its stdin; it answers on its stdout
(nothing else writes there: every command gets its own pipes). A command then costs a fork inside
the sandbox, not a new bubblewrap with its namespaces and mounts.

It runs one command at a time (the broker sends a second, concurrent command of the same sandbox
through a fresh bubblewrap), which is what keeps each command's semantics those of a bubblewrap of
its own: when the command's leader exits, or its deadline passes, the agent SIGKILLs every other
process of the sandbox's pid namespace (``kill(-1)``: all but the namespace's init and the agent),
as the end of a per-command pid namespace did, ``setsid`` and double-forked children included.

The agent makes itself non-dumpable, so that a command (same uid, no capabilities) cannot open its
file descriptors through /proc and forge answers to the broker; a command that kills the agent ends
its own namespace, which the broker reports as the command killed (exit 137).

This file is sent to the sandbox's python3 as source and must use only the standard library.

Frames, both ways: a header (payload length, kind, request id) and the payload. Broker to agent:
``X`` a request (JSON: argv, env, cwd, stdin, timeout_s, max_output_bytes, stream). Agent to broker:
``R`` ready (once), ``S`` taken (from here on the command may have run), ``o``/``e`` output bytes (up to the cap, all
of it when streaming), ``D`` done (JSON: exit_code, timed_out, stdout_truncated, stderr_truncated,
duration_s).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import struct
import subprocess
import sys
import time
from typing import Any, BinaryIO

HEADER = struct.Struct(">IcI")  # payload length, kind, request id
TIMEOUT_EXIT_CODE = 124
READ_CHUNK = 65_536
DRAIN_S = 5.0  # after a timeout, how long the killed command's pipes may take to close
PR_SET_DUMPABLE = 4


class Output:
    """One output stream of a command: forwarded as frames, up to a cap unless streaming."""

    def __init__(self, kind: bytes, cap: int, stream: bool) -> None:
        self.kind = kind
        self.room = cap
        self.stream = stream
        self.truncated = False

    def forward(self, out: BinaryIO, rid: int, data: bytes) -> None:
        if len(data) > self.room:
            self.truncated = True
            if not self.stream:
                data = data[: max(self.room, 0)]
        self.room -= len(data)
        if data:
            write_frame(out, self.kind, rid, data)


def write_frame(out: BinaryIO, kind: bytes, rid: int, payload: bytes) -> None:
    out.write(HEADER.pack(len(payload), kind, rid) + payload)
    out.flush()


def read_frame(inp: BinaryIO) -> tuple[bytes, int, bytes] | None:
    head = inp.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    size, kind, rid = HEADER.unpack(head)
    payload = inp.read(size)
    return (kind, rid, payload) if len(payload) == size else None


def sweep() -> None:
    """SIGKILL every process of the namespace but its init and this agent, until none is left."""
    me = os.getpid()
    for _ in range(100):
        with_pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
        if not any(_alive(pid) for pid in with_pids):
            return
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.001)


def _alive(pid: int) -> bool:
    """A process that is not a zombie (zombies are init's to collect)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] != b"Z"
    except OSError:
        return False


def spawn_error(request: dict[str, Any], exc: OSError) -> bytes:
    """What bubblewrap printed when it could not start a command (it exited 1)."""
    cwd = request["cwd"]
    if not os.path.isdir(cwd):
        return f"bwrap: Can't chdir to {cwd}: {os.strerror(exc.errno or 2)}\n".encode()
    return f"bwrap: execvp {request['argv'][0]}: {os.strerror(exc.errno or 2)}\n".encode()


def run(out: BinaryIO, rid: int, request: dict[str, Any]) -> None:
    started = time.monotonic()
    stdin = request.get("stdin")
    write_frame(out, b"S", rid, b"")  # before the spawn: a command that kills the agent at once has begun
    try:
        proc = subprocess.Popen(
            request["argv"], stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=request["env"], cwd=request["cwd"],
            start_new_session=True,
        )  # fmt: skip
    except OSError as exc:
        write_frame(out, b"e", rid, spawn_error(request, exc))
        done(out, rid, 1, False, [], started)
        return
    outputs = [Output(b"o", request["max_output_bytes"], request["stream"]),
               Output(b"e", request["max_output_bytes"], request["stream"])]  # fmt: skip
    timed_out = pump(out, rid, proc, outputs, stdin.encode() if stdin is not None else None, request["timeout_s"])
    code = proc.wait()
    done(out, rid, TIMEOUT_EXIT_CODE if timed_out else code if code >= 0 else 128 - code, timed_out, outputs, started)


def pump(out: BinaryIO, rid: int, proc: subprocess.Popen[bytes], outputs: list[Output], stdin: bytes | None,
         timeout_s: float) -> bool:  # fmt: skip
    """Move the command's output until both pipes close; kill the namespace's other processes when the
    leader exits or the deadline passes. Whether the deadline passed."""
    deadline = time.monotonic() + timeout_s
    selector = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    for pipe, output in zip((proc.stdout, proc.stderr), outputs, strict=True):
        selector.register(pipe, selectors.EVENT_READ, output)
    pidfd = os.pidfd_open(proc.pid)
    selector.register(pidfd, selectors.EVENT_READ, "exit")
    pending = _start_stdin(proc, stdin, selector)
    timed_out = False
    try:
        while len(selector.get_map()) > 0 and time.monotonic() < deadline + DRAIN_S:
            if pidfd in selector.get_map() and time.monotonic() >= deadline:
                timed_out = True
                _end(selector, pidfd)
            for key, _ in selector.select(max(deadline - time.monotonic(), 0.0) if not timed_out else DRAIN_S):
                if key.data == "exit":
                    _end(selector, pidfd)  # the end of the command's pid namespace, as with a bubblewrap of its own
                elif key.data is None:
                    pending = _feed(proc, pending, selector)
                else:
                    _read(out, rid, key, selector)
    finally:
        selector.close()
        os.close(pidfd)
    sweep()
    return timed_out


def _end(selector: selectors.BaseSelector, pidfd: int) -> None:
    selector.unregister(pidfd)
    sweep()


def _start_stdin(proc: subprocess.Popen[bytes], data: bytes | None, selector: selectors.BaseSelector) -> bytes:
    if data is None or proc.stdin is None:
        return b""
    os.set_blocking(proc.stdin.fileno(), False)
    if not data:
        proc.stdin.close()
        return b""
    selector.register(proc.stdin, selectors.EVENT_WRITE, None)
    return data


def _feed(proc: subprocess.Popen[bytes], pending: bytes, selector: selectors.BaseSelector) -> bytes:
    assert proc.stdin is not None
    try:
        pending = pending[os.write(proc.stdin.fileno(), pending[:READ_CHUNK]) :]
    except (BrokenPipeError, BlockingIOError) as exc:
        if isinstance(exc, BlockingIOError):
            return pending
        pending = b""
    if not pending:
        selector.unregister(proc.stdin)
        proc.stdin.close()
    return pending


def _read(out: BinaryIO, rid: int, key: selectors.SelectorKey, selector: selectors.BaseSelector) -> None:
    data = os.read(key.fd, READ_CHUNK)
    if data:
        key.data.forward(out, rid, data)
    else:
        selector.unregister(key.fileobj)
        key.fileobj.close()  # type: ignore[union-attr]


def done(out: BinaryIO, rid: int, code: int, timed_out: bool, outputs: list[Output], started: float) -> None:
    result = {"exit_code": code, "timed_out": timed_out, "duration_s": time.monotonic() - started,
              "stdout_truncated": bool(outputs and outputs[0].truncated),
              "stderr_truncated": bool(outputs and outputs[1].truncated)}  # fmt: skip
    write_frame(out, b"D", rid, json.dumps(result).encode())


def non_dumpable() -> None:
    """No /proc/<agent>/fd for the commands (same uid, no CAP_SYS_PTRACE): they cannot forge frames."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    non_dumpable()
    write_frame(out, b"R", 0, json.dumps({"pid": os.getpid()}).encode())
    while (frame := read_frame(inp)) is not None:
        kind, rid, payload = frame
        if kind == b"X":
            run(out, rid, json.loads(payload))


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
