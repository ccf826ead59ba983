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

This file is sent to the sandbox's python3 as source and must use only the standard library. It
starts once per sandbox, so it imports only modules built into the interpreter (and ctypes): no
json, subprocess, selectors or signal, whose imports (``re``, ``enum``, ``threading``...) cost
about 19 ms of CPU per sandbox, more than the rest of the agent's start. Requests come as marshal
data (written by the broker, the one party the agent trusts), answers are JSON formatted by hand
(the broker parses them as untrusted JSON), and a command is started by Popen's own core without
importing ``subprocess`` (:func:`spawn`).

Its frames are described in ``agents.py`` (the broker's side).
"""

from __future__ import annotations

import errno
import marshal
import math
import os
import select
import struct
import sys
import time

TYPE_CHECKING = False  # not ``typing``'s: importing typing (re, collections...) costs the agent's start
if TYPE_CHECKING:
    from typing import Any, BinaryIO

try:
    from _posixsubprocess import fork_exec as _fork_exec  # built into CPython (see ``spawn``)
except ImportError:
    _fork_exec = None  # type: ignore[assignment]

HEADER = struct.Struct(">IcI")  # payload length, kind, request id
TIMEOUT_EXIT_CODE = 124
READ_CHUNK = 65_536
DRAIN_S = 5.0  # after a timeout, how long the killed command's pipes may take to close
PR_SET_DUMPABLE = 4
SIGKILL = 9
MARSHAL_VERSION = 4  # the broker's and the sandbox's interpreters may differ: one both read (3.4+)
EXIT = -1  # the role in ``pump`` of the command's pidfd
FEED = -2  # and of the pipe to its stdin
POLL_S = 0.02  # without a pidfd (gVisor), how often the command's exit is looked for
REAPER = False  # forked by the zygote (agent_zygote.py): its commands' orphans are its to collect


class Output:
    """One output stream of a command: forwarded as frames, up to a cap unless streaming."""

    def __init__(self, kind: bytes, cap: int, stream: bool) -> None:
        self.kind, self.room, self.stream = kind, cap, stream
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
        if not any(_alive(int(p)) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)):
            return
        try:
            os.kill(-1, SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.001)


def _alive(pid: int) -> bool:
    """A process that is not a zombie (zombies are init's to collect). Read unbuffered: open, read,
    close (a buffered file adds fstat, ioctl and seeks on every command)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.read(fd, 4096).rpartition(b")")[2].split()[:1] != [b"Z"]
        finally:
            os.close(fd)
    except OSError:
        return False


def spawn_error(request: dict[str, Any], exc: OSError) -> bytes:
    """What bubblewrap printed when it could not start a command (it exited 1)."""
    if not os.path.isdir(cwd := request["cwd"]):
        return f"bwrap: Can't chdir to {cwd}: {os.strerror(exc.errno or 2)}\n".encode()
    return f"bwrap: execvp {request['argv'][0]}: {os.strerror(exc.errno or 2)}\n".encode()


class Child:
    """A started command: its pid and the agent's ends of its pipes (stdin None: /dev/null)."""

    def __init__(self, pid: int, stdin: int | None, stdout: int, stderr: int, popen: Any = None) -> None:
        self.pid = pid
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.popen = popen  # the Popen that started it, where it is Popen's to reap
        self.cpu_s: float | None = None  # once reaped: its CPU, with the children it waited for

    def wait(self) -> int:
        """The exit code as ``Popen.returncode`` gives it (-N: killed by signal N)."""
        if self.popen is not None:
            return int(self.popen.wait())
        _, status, usage = os.wait4(self.pid, 0)
        self.cpu_s = usage.ru_utime + usage.ru_stime
        return os.waitstatus_to_exitcode(status)


def spawn(argv: list[str], env: dict[str, str], cwd: str, with_stdin: bool, user: Any = None) -> Child:
    """``subprocess.Popen(argv, env=env, cwd=cwd, stdin=PIPE or DEVNULL, stdout=PIPE, stderr=PIPE,
    start_new_session=True)``; an OSError when the command could not be started.

    On Python 3.11 to 3.13 this is Popen's own core (``_posixsubprocess.fork_exec``: vfork, every
    other descriptor closed, signals restored, a new session) called as Popen calls it, without
    importing ``subprocess`` (about 20 ms of the agent's start); elsewhere it is Popen."""
    if _fork_exec is None or not (3, 11) <= sys.version_info[:2] < (3, 14):
        return _popen(argv, env, cwd, with_stdin, user)
    head = os.fsencode(argv[0])
    paths = (head,) if os.path.dirname(head) else tuple(  # a bare name: Popen's own search of PATH
        os.path.join(os.fsencode(d), head) for d in os.get_exec_path(env))  # fmt: skip
    env_list = []
    for key, value in env.items():
        if "=" in key:
            raise ValueError("illegal environment variable name")
        env_list.append(os.fsencode(key) + b"=" + os.fsencode(value))
    p2cread, p2cwrite = os.pipe() if with_stdin else (os.open(os.devnull, os.O_RDWR), -1)
    c2pread, c2pwrite = os.pipe()
    errread, errwrite = os.pipe()
    report_r, report_w = os.pipe()
    groups: list[int] | None = [] if user else None  # gVisor: the agent is root there, the command is not
    uid, gid = (user[0], user[1]) if user else (None, None)
    try:
        # fmt: off
        pid = _fork_exec(  # as Popen calls it: close_fds, the report pipe kept, cwd, env, the pipes, then
            argv, paths, True, (report_w,), cwd, env_list, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
            report_r, report_w, True, True, -1, gid, groups, uid, -1, None, True,  # type: ignore[arg-type]
        )  # restore_signals, setsid; no process group; the uid/gid asked for; no umask or preexec_fn; vfork
        # fmt: on
    except BaseException:
        for fd in (p2cwrite, c2pread, errread, report_r):
            if fd >= 0:
                os.close(fd)
        raise
    finally:
        for fd in (p2cread, c2pwrite, errwrite, report_w):
            os.close(fd)
    _raise_child_error(pid, report_r, (p2cwrite, c2pread, errread))
    return Child(pid, p2cwrite if with_stdin else None, c2pread, errread)


def _raise_child_error(pid: int, report: int, ours: tuple[int, ...]) -> None:
    """What the child reported before its exec (``OSError:<hex errno>:...``), raised as Popen does."""
    chunks = []
    while chunk := os.read(report, 50_000):
        chunks.append(chunk)
    os.close(report)
    if not chunks:
        return
    for fd in ours:
        if fd >= 0:
            os.close(fd)
    os.waitpid(pid, 0)
    kind, _, rest = b"".join(chunks).partition(b":")
    code = int(rest.partition(b":")[0] or b"0", 16) if kind == b"OSError" else 0
    raise OSError(code or errno.EIO, os.strerror(code or errno.EIO))


def _popen(argv: list[str], env: dict[str, str], cwd: str, with_stdin: bool, user: Any = None) -> Child:
    import subprocess

    ids: dict[str, Any] = {"user": user[0], "group": user[1], "extra_groups": []} if user else {}
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True, **ids,
    )  # fmt: skip
    pipes = [proc.stdin, proc.stdout, proc.stderr]
    stdin, stdout, stderr = (os.dup(pipe.fileno()) if pipe is not None else None for pipe in pipes)
    for pipe in pipes:
        if pipe is not None:
            pipe.close()
    assert stdout is not None and stderr is not None
    return Child(proc.pid, stdin, stdout, stderr, proc)


def run(out: BinaryIO, rid: int, request: dict[str, Any]) -> None:
    started = time.monotonic()
    stdin = request.get("stdin")
    write_frame(out, b"S", rid, b"")  # before the spawn: a command that kills the agent at once has begun
    try:
        child = spawn(request["argv"], request["env"], request["cwd"], stdin is not None, request.get("user"))
    except OSError as exc:
        write_frame(out, b"e", rid, spawn_error(request, exc))
        done(out, rid, 1, False, [], started)
        return
    outputs = [Output(b"o", request["max_output_bytes"], request["stream"]),
               Output(b"e", request["max_output_bytes"], request["stream"])]  # fmt: skip
    timed_out = pump(out, rid, child, outputs, stdin.encode() if stdin is not None else None, request["timeout_s"])
    code = child.wait()
    if os.getpid() == 1 or REAPER:
        reap_orphans()
    done(out, rid, TIMEOUT_EXIT_CODE if timed_out else code if code >= 0 else 128 - code, timed_out, outputs, started,
         child.cpu_s)  # fmt: skip


class Pump:
    """The descriptors ``pump`` waits on and what each one is: an output, the exit, the stdin feed."""

    def __init__(self) -> None:
        self.poller = select.poll()
        self.roles: dict[int, Output | int] = {}

    def add(self, fd: int, role: Output | int, events: int = select.POLLIN) -> None:
        self.poller.register(fd, events)
        self.roles[fd] = role

    def drop(self, fd: int, close: bool = True) -> None:
        self.poller.unregister(fd)
        del self.roles[fd]
        if close:
            os.close(fd)

    def wait(self, timeout_s: float) -> list[int]:
        return [fd for fd, _ in self.poller.poll(math.ceil(timeout_s * 1000) if timeout_s > 0 else 0)]


def pump(out: BinaryIO, rid: int, child: Child, outputs: list[Output], stdin: bytes | None,
         timeout_s: float) -> bool:  # fmt: skip
    """Move the command's output until both pipes close; kill the namespace's other processes when the
    leader exits or the deadline passes. Whether the deadline passed."""
    deadline = time.monotonic() + timeout_s
    fds = Pump()
    for pipe, output in zip((child.stdout, child.stderr), outputs, strict=True):
        fds.add(pipe, output)
    pidfd = _pidfd(child.pid)
    if pidfd >= 0:
        fds.add(pidfd, EXIT)
    pending = _start_stdin(child, stdin, fds)
    timed_out, watching = False, True  # watching: the leader has not been seen to exit
    try:
        while (fds.roles or watching) and time.monotonic() < deadline + DRAIN_S:
            if watching and time.monotonic() >= deadline:
                timed_out, watching = True, _end(fds, pidfd)
            wait_s = max(deadline - time.monotonic(), 0.0) if not timed_out else DRAIN_S
            ready = fds.wait(min(wait_s, POLL_S) if watching and pidfd < 0 else wait_s)
            if watching and pidfd < 0 and _exited(child.pid):
                watching = _end(fds, pidfd)
            for fd in ready:
                role = fds.roles.get(fd)
                if role == EXIT:
                    watching = _end(fds, pidfd)  # the end of the command's pid namespace, as with a bubblewrap
                elif role == FEED:
                    pending = _feed(fd, pending, fds)
                elif isinstance(role, Output):
                    _read(out, rid, fd, role, fds)
    finally:
        for fd in list(fds.roles):
            fds.drop(fd, close=fd != pidfd)
        if pidfd >= 0:
            os.close(pidfd)
    if watching:  # the drain ran out before the leader's exit was seen (``_end`` sweeps where it was)
        sweep()
    return timed_out


def _pidfd(pid: int) -> int:
    """A pidfd of the command, or -1 where the kernel has none (gVisor): its exit is then polled for."""
    try:
        return os.pidfd_open(pid)
    except OSError:
        return -1


def _exited(pid: int) -> bool:
    """Whether the command's leader has exited (left unreaped: ``Child.wait`` collects it)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _end(fds: Pump, pidfd: int) -> bool:
    if pidfd in fds.roles:
        fds.drop(pidfd, close=False)
    sweep()
    return False


def reap_orphans() -> None:
    """As the namespace's init (gVisor: the agent is its container's first process) or its commands'
    subreaper (forked by the zygote), collect the zombies of their killed descendants."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            continue
    except ChildProcessError:
        return


def _start_stdin(child: Child, data: bytes | None, fds: Pump) -> bytes:
    if data is None or child.stdin is None:
        return b""
    os.set_blocking(child.stdin, False)
    if not data:
        os.close(child.stdin)
        return b""
    fds.add(child.stdin, FEED, select.POLLOUT)
    return data


def _feed(fd: int, pending: bytes, fds: Pump) -> bytes:
    try:
        pending = pending[os.write(fd, pending[:READ_CHUNK]) :]
    except (BrokenPipeError, BlockingIOError) as exc:
        if isinstance(exc, BlockingIOError):
            return pending
        pending = b""
    if not pending:
        fds.drop(fd)
    return pending


def _read(out: BinaryIO, rid: int, fd: int, output: Output, fds: Pump) -> None:
    if data := os.read(fd, READ_CHUNK):
        output.forward(out, rid, data)
    else:
        fds.drop(fd)


def done(out: BinaryIO, rid: int, code: int, timed_out: bool, outputs: list[Output], started: float,
         cpu_s: float | None = None) -> None:  # fmt: skip
    flags = [b"true" if f else b"false" for f in (timed_out, *(o.truncated for o in outputs))] + [b"false"] * 2
    write_frame(out, b"D", rid, b'{"exit_code": %d, "timed_out": %s, "duration_s": %s, "stdout_truncated": %s, '
                b'"stderr_truncated": %s, "cpu_s": %s}' % (code, flags[0], repr(time.monotonic() - started).encode(),
                flags[1], flags[2], b"null" if cpu_s is None else repr(cpu_s).encode()))  # fmt: skip


def non_dumpable() -> None:
    """No /proc/<agent>/fd for the commands (same uid, no CAP_SYS_PTRACE): they cannot forge frames."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def close_on_exec() -> None:
    """Whatever the agent was started with beyond 0, 1 and 2 is not passed on to its commands (what
    Popen's close_fds did per command; the agent's own descriptors are close-on-exec already)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:  # the listing's own descriptor, closed by now
                continue


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    non_dumpable()
    close_on_exec()
    write_frame(out, b"R", 0, b'{"pid": %d}' % os.getpid())
    while (frame := read_frame(inp)) is not None:
        kind, rid, payload = frame
        if kind == b"X":
            run(out, rid, marshal.loads(payload))


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
