"""The launch namespace: a small mount namespace that every bubblewrap of a local sandbox starts
from, so that its cost does not grow with the sandboxes that already run.

bubblewrap copies the mount namespace it starts in and, for each of its binds, reads the copy's
whole mount table (``/proc/self/mountinfo``) to find the submounts to remount. On the host, each
live sandbox adds its own mounts (its loop-mounted disk, an image's overlay, an egress namespace's
file), so with 384 sandboxes up each new one read about 400 lines twenty times: a cold sandbox's
CPU went from about 29 to 67 ms (``rollout bench broker``; the profile put 59% of the machine's
time in bubblewrap, most of it the kernel writing mount tables and bubblewrap parsing them).

Here a holder process (stdlib only, root, dies with the broker) owns a private copy of the host's
mount namespace with every sandbox's mounts taken out. Before a launch the broker clones the
sandbox's directory with its submounts (``open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)``) and the
holder moves the clone onto the same path in its namespace (``move_mount``); the command starts
there (``nsenter --mount``, whose path names the holder's namespace); once it has copied the
namespace (the agent is up, the command is done) the holder detaches the clone again. The launch
namespace holds the host's own mounts and the sandboxes starting at that moment, whatever the
number of sandboxes alive. The clone is the same filesystem: nothing else changes for the sandbox.

Of the host's own mounts, it also leaves out the kernel filesystems that no launch reads through
it: /sys and every mount below it (with cgroup v1, a dozen), and the mounts below /proc and /dev
(devpts, /dev/shm, mqueue, binfmt_misc). bubblewrap mounts a /proc, a devpts and a /dev/shm of its
own, binds device nodes from /dev itself and nothing of /sys, and a sandbox's cgroups are joined
before this namespace is entered. On a host of 21 mounts, 4 are left: about 1 ms of CPU less per
bubblewrap, which copies the table and reads it once per bind.

Where the holder cannot run (not root, an old kernel, it died), launches start from the broker's
own namespace, as before.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import ctypes
import logging
import os
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

log = logging.getLogger(__name__)

SYS_OPEN_TREE = 428  # x86_64 and aarch64 alike (the new mount API's numbers are shared)
OPEN_TREE_CLONE = 1
AT_RECURSIVE = 0x8000
AT_FDCWD = -100
START_TIMEOUT_S = 30.0
# agents starting at once (each attached until it is up): the launch namespace holds at most this many
# sandboxes' mounts beside the host's; more at once would only queue on the CPUs with bigger copies
BRIEF_LAUNCHES = max(4, 2 * (os.cpu_count() or 1))

# the holder: run by ``python3 -I -S -c`` with its control socket on stdin and the directory whose
# submounts it takes out as its argument. Requests, one per datagram: ``A<path>`` with two
# descriptors (the clone, a socket to answer on: ``ok`` or the error), ``D<path>`` (no answer).
HOLDER = r"""
import ctypes, os, signal, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
def check(rc, what):
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, what + ": " + os.strerror(e))
parent = os.getppid()
check(libc.prctl(1, signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")
if os.getppid() != parent:
    sys.exit(0)
check(libc.unshare(0x20000), "unshare(CLONE_NEWNS)")
check(libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None), "make / rprivate")
top = sys.argv[1]
with open("/proc/self/mountinfo", "rb") as f:
    points = [line.split(b" ")[4].decode("unicode_escape") for line in f.read().splitlines() if line]
# a point mounted twice (stacked) is listed twice: each mount is taken out
unused = [p for p in points if p.startswith((top + "/", "/sys/", "/proc/", "/dev/")) or p == "/sys"]
for point in sorted(unused, key=len, reverse=True):
    libc.umount2(point.encode(), 2 | 8)
control = socket.socket(fileno=0)
control.send(b"ready")
size = ctypes.sizeof(ctypes.c_int)
while True:
    message, ancillary, _, _ = control.recvmsg(8192, socket.CMSG_SPACE(2 * size))
    if not message:
        break
    fds = [int.from_bytes(data[i:i + size], sys.byteorder) for level, kind, data in ancillary
           if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
           for i in range(0, len(data) - len(data) % size, size)]
    path = message[1:]
    try:
        if message[:1] == b"A" and len(fds) == 2:
            rc = libc.syscall(429, fds[0], b"", -100, path, 4)
            answer = b"ok" if rc == 0 else os.strerror(ctypes.get_errno()).encode()
            with socket.socket(fileno=os.dup(fds[1])) as reply:
                reply.send(answer)
        elif message[:1] == b"D":
            libc.umount2(path, 2 | 8)
    finally:
        for fd in fds:
            os.close(fd)
"""

_libc = ctypes.CDLL(None, use_errno=True)


def clone_tree(path: Path) -> int:
    """A detached copy of ``path`` with every mount below it (root only): a descriptor."""
    fd = int(_libc.syscall(SYS_OPEN_TREE, AT_FDCWD, os.fsencode(path), OPEN_TREE_CLONE | os.O_CLOEXEC | AT_RECURSIVE))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"open_tree({path}): {os.strerror(err)}")
    return fd


def launching(space: LaunchNamespace | None, root: Path, brief: bool) -> AbstractAsyncContextManager[str | None]:
    """``space.attached``, or the broker's own namespace (None) where there is no launch namespace."""
    return space.attached(root, brief) if space is not None else contextlib.nullcontext(None)


class LaunchNamespace:
    """The holder of this broker's launch namespace, and the sandboxes attached to it now."""

    def __init__(self, sandboxes: Path, python: str) -> None:
        self.sandboxes = sandboxes  # every sandbox's mounts are below it
        self.python = python
        # a plain child, never reaped while the broker runs: a dead holder stays a zombie, so its pid
        # (which the launches' ``nsenter`` names) is never another process's
        self.proc: subprocess.Popen[bytes] | None = None
        self.dead: list[subprocess.Popen[bytes]] = []
        self.control: socket.socket | None = None
        self.users: dict[Path, int] = {}
        self.attaching: dict[Path, asyncio.Future[bool]] = {}
        self.brief = asyncio.Semaphore(BRIEF_LAUNCHES)
        self.starting = 0  # brief launches under way (at most BRIEF_LAUNCHES): /metrics
        self.problem = "not started"

    def start(self) -> None:
        """Start the holder; where it cannot run, ``problem`` says why and launches stay on the host.
        Called on the event loop's thread: the holder dies with the thread that started it."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self.close_control()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        proc: subprocess.Popen[bytes] | None = None
        try:
            with theirs:
                argv = [self.python, "-I", "-S", "-c", HOLDER, str(self.sandboxes)]
                env = {"PATH": "/usr/bin:/bin"}
                proc = subprocess.Popen(argv, stdin=theirs.fileno(), stderr=subprocess.PIPE, env=env)
            ours.settimeout(START_TIMEOUT_S)
            ready = ours.recv(16)
            if ready == b"ready":  # what each launch does, tried once: a kernel before 5.2 says so here
                os.close(clone_tree(self.sandboxes))
        except OSError as exc:  # no holder, no answer in time, or no open_tree
            ready = str(exc).encode()
        if ready != b"ready":
            ours.close()
            said = ""
            if proc is not None:
                proc.kill()
                proc.wait()
                said = proc.stderr.read().decode(errors="replace")[-500:] if proc.stderr else ""
                if proc.stderr is not None:
                    proc.stderr.close()
            why = ready.decode(errors="replace") or said.strip() or "it ended"
            self.problem = f"the launch namespace's holder did not start: {why}"
            log.warning("%s: sandboxes start from the broker's mount namespace", self.problem)
            return
        ours.settimeout(5.0)  # a full queue waits for the holder (microseconds a request); a hung one fails
        self.proc, self.control, self.problem = proc, ours, ""

    @property
    def path(self) -> str | None:
        """The namespace to start sandboxes in (``nsenter --mount``), None while there is none."""
        return f"/proc/{self.proc.pid}/ns/mnt" if self.proc is not None and self.control is not None else None

    @contextlib.asynccontextmanager
    async def attached(self, root: Path, brief: bool) -> AsyncIterator[str | None]:
        """``root`` (a sandbox's directory) is in the launch namespace meanwhile: the namespace to
        start in, or None (the broker's own). Concurrent launches of one sandbox share the attach.
        ``brief``: an agent's start, one of at most ``BRIEF_LAUNCHES`` at once (a command run
        alone stays attached while it runs, and takes no turn)."""
        async with self.brief if brief else contextlib.nullcontext(), self._attached(root) as mount_ns:
            self.starting += int(brief)
            try:
                yield mount_ns
            finally:
                self.starting -= int(brief)

    @contextlib.asynccontextmanager
    async def _attached(self, root: Path) -> AsyncIterator[str | None]:
        count = self.users.get(root, 0)
        self.users[root] = count + 1
        try:
            if count == 0:
                self.attaching[root] = asyncio.ensure_future(self._attach(root))
            ok = await asyncio.shield(self.attaching[root])
            yield self.path if ok else None
        finally:
            self.users[root] -= 1
            if self.users[root] == 0:
                del self.users[root]
                attach = self.attaching.pop(root)
                if attach.done():
                    self._detach(attach, root)
                else:  # its first user was cancelled: detach once it is in
                    attach.add_done_callback(lambda done: self._detach(done, root))

    def _detach(self, attach: asyncio.Future[bool], root: Path) -> None:
        if not attach.cancelled() and attach.exception() is None and attach.result():
            self._send(b"D" + os.fsencode(root), [])

    async def _attach(self, root: Path) -> bool:
        if self.control is None:
            return False
        try:
            tree = clone_tree(root)
        except OSError as exc:
            log.warning("%s: this launch starts from the broker's mount namespace", exc)
            return False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with ours:
            try:
                with theirs:
                    sent = self._send(b"A" + os.fsencode(root), [tree, theirs.fileno()])
            finally:
                os.close(tree)
            if not sent:
                return False
            ours.setblocking(False)
            try:
                answer = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(ours, 512), START_TIMEOUT_S)
            except TimeoutError:
                answer = b"no answer in time"
        if answer != b"ok":
            log.warning("the launch namespace did not take %s (%s): this launch starts from the broker's",
                        root, answer.decode(errors="replace") or "its holder ended")  # fmt: skip
        return answer == b"ok"

    def _send(self, message: bytes, fds: list[int]) -> bool:
        if self.control is None:
            return False
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        try:
            self.control.sendmsg([message], ancillary)
            return True
        except OSError as exc:  # the holder ended (or hangs): this launch without it, the next with another
            log.warning("the launch namespace's holder is gone (%s): starting another", exc)
            self.close_control()
            self.start()
            return False

    def close_control(self) -> None:
        if self.control is not None:
            self.control.close()
            self.control = None
        if self.proc is not None:
            self.dead.append(self.proc)
            self.proc = None

    def close(self) -> None:
        """End the holder (it ends at the end of its input) and reap every holder this broker had."""
        self.close_control()
        for proc in self.dead:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
        self.dead.clear()
