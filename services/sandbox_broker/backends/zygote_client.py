"""The broker's side of the exec agents' zygote (``agent_zygote.py``): the process itself, its
requests (an agent forked into a sandbox, a sandbox's bubblewrap started), and the bubblewraps it
started, watched by pidfd."""

from __future__ import annotations

import array
import asyncio
import marshal
import os
import signal
import socket
from functools import cache
from pathlib import Path

from services.sandbox_broker.backends import agent_zygote, exec_agent

START_TIMEOUT_S = 30.0
# the zygote's interpreter runs exec_agent.py's source, then agent_zygote.py's, in one namespace (sent
# on its control socket: its command line, which the sandboxes' ps shows, names no host path)
ZYGOTE_MAIN = (
    "import socket;s=socket.socket(fileno=0);g={'__name__':'zygote'}\n"
    "for n in 'ab':exec(compile(s.recv(1<<20),'zygote','exec'),g)\ng['main'](s)"
)


@cache
def source() -> bytes:
    return Path(exec_agent.__file__).read_bytes()


@cache
def _zygote_sources() -> tuple[bytes, bytes]:
    return source(), Path(agent_zygote.__file__).read_bytes()


async def readable(fd: int | socket.socket, timeout_s: float) -> None:
    """Until ``fd`` (non-blocking) has something to read."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await asyncio.wait_for(readable, timeout_s)
    finally:
        loop.remove_reader(fd)


async def read_line(fd: int, timeout_s: float) -> bytes:
    """One line from a pipe (at most 4 KiB, what one write of it brings)."""
    os.set_blocking(fd, False)
    await readable(fd, timeout_s)
    return os.read(fd, 4096)


def only_child(pid: int) -> int:
    """Bubblewrap's one child, its sandbox's pid 1 (the stub), as the host sees it."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    if len(children) != 1:
        raise OSError(f"bubblewrap {pid} has {len(children)} children, not its sandbox's one")
    return int(children[0])


class AgentZygote:
    """The zygote (agent_zygote.py) that forks the exec agents: started at its first use, and again
    at the next one after it ended; it ends when the broker closes its control socket."""

    def __init__(self, python: str, env: dict[str, str]) -> None:
        self.argv = [python, "-I", "-S", "-c", ZYGOTE_MAIN]
        self.env = env
        self.proc: asyncio.subprocess.Process | None = None
        self.control: socket.socket | None = None
        self.lock = asyncio.Lock()

    async def start(self) -> None:
        async with self.lock:
            if self.proc is not None and self.proc.returncode is None:
                return
            await self.close()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            with theirs:
                self.proc = await asyncio.create_subprocess_exec(*self.argv, stdin=theirs.fileno(), env=self.env,
                                                                 start_new_session=True)  # fmt: skip
            for source in _zygote_sources():
                ours.send(source)
            self.control = ours

    def fork(self, request: dict[str, object], channel: int, log: int) -> None:
        """Ask for an agent (``request``: agent_zygote.Zygote.enter) on ``channel``, writing to ``log``."""
        self._send(request, [channel, log])

    async def spawn(self, request: dict[str, object], stdin: int, stdout: int, stderr: int) -> Spawned:
        """Start a sandbox's bubblewrap (``request``: agent_zygote.Zygote.launch) on these descriptors."""
        ours, theirs = socket.socketpair()
        with ours:
            with theirs:
                self._send(request, [stdin, stdout, stderr, theirs.fileno()])
            ours.setblocking(False)
            await readable(ours, START_TIMEOUT_S)
            pid, fds, _, _ = socket.recv_fds(ours, 32, 1)
        if not pid or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise OSError("the zygote did not start the sandbox's bubblewrap")
        return Spawned(int(pid), fds[0])

    def _send(self, request: dict[str, object], fds: list[int]) -> None:
        if self.control is None:
            raise OSError("the exec agents' zygote is not running")
        rights = array.array("i", fds)
        self.control.sendmsg([marshal.dumps(request)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])

    async def close(self) -> None:
        if self.control is not None:
            self.control.close()  # the zygote's end of input: it exits
            self.control = None
        if self.proc is not None:
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
            self.proc = None


class Spawned:
    """A process the zygote started for this broker (its sandbox's bubblewrap), watched by its pidfd:
    it is the zygote's child, so its exit status is not this process's to read."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.returncode: int | None = None  # -1 once it ended (its status is the zygote's)
        self.holds: list[int] = []  # descriptors of its own (its stdin's write end) closed when it ends
        self.ended = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().add_reader(pidfd, self._end)

    def _end(self) -> None:
        asyncio.get_running_loop().remove_reader(self.pidfd)
        for fd in (self.pidfd, *self.holds):
            os.close(fd)
        self.returncode = -1
        if not self.ended.done():
            self.ended.set_result(None)

    def kill(self) -> None:
        if self.returncode is not None:
            raise ProcessLookupError(self.pid)
        signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def take(self) -> None:
        """Kill it with its child, where its sandbox may still be setting up (``agent_zygote.take``): a
        kill of bubblewrap alone orphaned a child still waiting for its uid map, for good."""
        if self.returncode is None:
            agent_zygote.take(self.pid, lambda sig: signal.pidfd_send_signal(self.pidfd, sig))

    async def wait(self) -> int:
        await asyncio.shield(self.ended)
        return -1
