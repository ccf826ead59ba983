"""The broker's side of the exec agents (``exec_agent.py``): one per local sandbox, started with it
as the command of a bubblewrap that lives as long as the sandbox, and spoken to over its pipes.

An agent runs one command at a time; a sandbox whose agent is busy (a second, concurrent command),
is starting, or cannot start runs the command through a bubblewrap of its own, as before agents.
The agent's pipes tie it to this broker process: bubblewrap's ``--die-with-parent`` ends it (and
every process of the sandbox) with the broker, and a restarted broker starts a new one at the
sandbox's next command.

Frames, both ways: a header (payload length, kind, request id) and the payload. Broker to agent:
``X`` a request (marshal: argv, env, cwd, stdin, timeout_s, max_output_bytes, stream, user). Agent to
broker: ``R`` ready (once), ``S`` taken (from here on the command may have run), ``o``/``e`` output
bytes (up to the cap, all of it when streaming), ``D`` done (JSON: exit_code, timed_out,
stdout_truncated, stderr_truncated, duration_s, cpu_s: the command's CPU from the agent's ``wait4``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import marshal
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from services.protocol.sandboxes import ExecResult
from services.runtime.tasks import cancel_and_wait
from services.sandbox_broker.backends import exec_agent
from services.sandbox_broker.backends.base import OutputBuffer, OutputSink
from services.sandbox_broker.backends.zygote_client import (
    START_TIMEOUT_S,
    AgentZygote,
    Spawned,
    only_child,
    read_line,
    source,
)

log = logging.getLogger(__name__)

BOOTSTRAP = "import sys;n=int(sys.stdin.buffer.readline());exec(compile(sys.stdin.buffer.read(n),'exec_agent','exec'))"
GRACE_S = 10.0  # past a command's timeout, how long the broker waits for the agent before killing it
KILLED_EXIT_CODE = 137  # the command killed the agent (and so its own namespace): as if SIGKILLed


def stub(rlimits: dict[str, int]) -> list[str]:
    """A zygote-forked agent's sandbox: bubblewrap's command, pid 1 of its namespace, takes the
    sandbox's rlimits (soft and hard: the shell's ``ulimit``, as ``bwrap.limits_prefix`` sets them),
    says when it is set up and waits (the shell's own read: no second program to start) until the
    broker closes its stdin; a limit it cannot set ends it, unready (its error in the agent's log). It
    closes its stderr (that log, on the host) before it says it is ready, so that once ready it never
    holds it: a command of the same uid that took the stub over (ptrace) writes nothing there."""
    limits = "".join(f"ulimit -{flag} {int(value)} && " for flag, value in rlimits.items())
    return ["--as-pid-1", "/bin/sh", "-c", f"{limits}exec 2>&- && echo || exit 1; read -r _"]


def _seconds(value: object) -> float | None:
    """A duration the agent reported: a finite number of seconds, else None (its frames are the sandbox's)."""
    return float(value) if isinstance(value, int | float) and 0 <= value < float("inf") else None


def agent_command(python: str) -> list[str]:
    """The agent's argv inside the sandbox: its source comes first on stdin."""
    return [python, "-I", "-S", "-c", BOOTSTRAP]


@dataclass(frozen=True, slots=True)
class AgentRequest:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    stdin: str | None
    timeout_s: float
    max_output_bytes: int
    user: tuple[int, int] | None = None  # (uid, gid) the command drops to (gVisor: the agent is root there)

    def frame(self, rid: int, stream: bool) -> bytes:
        body = {"argv": self.argv, "env": self.env, "cwd": self.cwd, "stdin": self.stdin, "user": self.user,
                "timeout_s": self.timeout_s, "max_output_bytes": self.max_output_bytes, "stream": stream}  # fmt: skip
        payload = marshal.dumps(body, exec_agent.MARSHAL_VERSION)  # the agent trusts the broker (exec_agent.py)
        return exec_agent.HEADER.pack(len(payload), b"X", rid) + payload


class NotStarted(Exception):
    """The agent ended before it started the command: the command can run elsewhere."""


class ExecAgent:
    """One running agent: its bubblewrap process and pipes."""

    def __init__(self, proc: asyncio.subprocess.Process | Spawned, log_path: Path,
                 reader: asyncio.StreamReader | None = None,
                 writer: asyncio.StreamWriter | None = None) -> None:  # fmt: skip
        self.proc = proc  # bubblewrap: the agent, or (started by the zygote) the sandbox's stub's
        self.log_path = log_path
        self.busy = False
        self.next_id = 1
        if isinstance(proc, asyncio.subprocess.Process):  # the agent on bubblewrap's pipes
            reader, writer = reader or proc.stdout, writer or proc.stdin
        assert reader is not None and writer is not None
        self.reader: asyncio.StreamReader = reader
        self.writer: asyncio.StreamWriter = writer

    @classmethod
    async def start(cls, argv: list[str], env: dict[str, str], log_path: Path) -> ExecAgent:
        with log_path.open("ab") as stderr:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env,
                start_new_session=True, limit=2**20,
            )  # fmt: skip
        agent = cls(proc, log_path)
        try:
            agent.writer.write(b"%d\n" % len(source()) + source())
            await agent._ready()
        except BaseException:
            await agent.stop()
            raise
        return agent

    @classmethod
    async def fork(cls, zygote: AgentZygote, argv: list[str], env: dict[str, str], log_path: Path,
                   launch: dict[str, object], cwd: str) -> ExecAgent:  # fmt: skip
        """An agent forked by the zygote into the namespaces of the sandbox's bubblewrap (``argv``,
        ending in ``stub``), which the zygote starts first (``launch``: agent_zygote.Zygote.launch; the
        agent joins the same cgroups under the same rlimits and uid, in ``cwd``)."""
        stdin, ours = os.pipe()  # the stub reads it until this process closes it (or ends)
        theirs, ready = os.pipe()
        try:
            with log_path.open("ab") as stderr:
                try:
                    proc = await zygote.spawn({**launch, "argv": argv, "env": env}, stdin, ready, stderr.fileno())
                finally:
                    os.close(stdin)
                    os.close(ready)
                proc.holds.append(ours)
                ours = -1
                try:
                    if await read_line(theirs, START_TIMEOUT_S) != b"\n":
                        raise OSError(f"the sandbox's namespaces were not made (see {log_path})")
                    channel, end = socket.socketpair()
                    with end:
                        zygote.fork({**launch, "cwd": cwd, "stub": only_child(proc.pid)}, end.fileno(), stderr.fileno())
                    reader, writer = await asyncio.open_unix_connection(sock=channel, limit=2**20)
                except BaseException:  # its sandbox may still be setting up: bubblewrap goes with its child
                    proc.take()
                    await proc.wait()
                    raise
        finally:
            os.close(theirs)
            if ours >= 0:
                os.close(ours)
        agent = cls(proc, log_path, reader, writer)
        try:
            await agent._ready()
        except BaseException:
            await agent.stop()
            raise
        return agent

    async def _ready(self) -> None:
        frame = await asyncio.wait_for(self._frame(), START_TIMEOUT_S)
        if frame is None or frame[0] != b"R":
            raise OSError(f"the exec agent did not start (see {self.log_path})")

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def run(self, request: AgentRequest, sink: OutputSink | None) -> ExecResult:
        """Run one command; NotStarted when the agent was gone before it began."""
        rid, self.next_id = self.next_id, self.next_id + 1
        out, err = OutputBuffer(request.max_output_bytes), OutputBuffer(request.max_output_bytes)
        started = time.monotonic()
        try:
            self.writer.write(request.frame(rid, sink is not None))
            async with asyncio.timeout(request.timeout_s + GRACE_S):  # no task of its own, as wait_for has
                done = await self._collect(out, err, sink)
        except TimeoutError:
            log.warning("exec agent %d did not answer past a command's deadline: killed", self.proc.pid)
            done = {"exit_code": exec_agent.TIMEOUT_EXIT_CODE, "timed_out": True}
        except ConnectionError as exc:
            await self.stop()
            raise NotStarted from exc
        except BaseException:  # not started, or cancelled (the caller went away): nothing may run on
            await self.stop()
            raise
        if "duration_s" not in done:  # the agent is gone or hangs: its namespace must end with the command
            await self.stop()
        return ExecResult.model_construct(  # every field given, each converted here: nothing to validate
            exit_code=int(done["exit_code"]), stdout=out.text(), stderr=err.text(),
            stdout_truncated=out.truncated or bool(done.get("stdout_truncated")),
            stderr_truncated=err.truncated or bool(done.get("stderr_truncated")),
            timed_out=bool(done["timed_out"]), duration_s=float(done.get("duration_s", time.monotonic() - started)),
            cpu_s=_seconds(done.get("cpu_s")),
        )  # fmt: skip

    async def _collect(self, out: OutputBuffer, err: OutputBuffer, sink: OutputSink | None) -> dict[str, float]:
        began = False
        while (frame := await self._frame()) is not None:
            kind, _, payload = frame
            if kind == b"D":
                result: dict[str, float] = orjson.loads(payload)
                return result
            began = True
            if kind in (b"o", b"e"):
                (out if kind == b"o" else err).add(payload)
                if sink is not None:
                    await sink("stdout" if kind == b"o" else "stderr", payload)
        if not began:
            raise NotStarted
        return {"exit_code": KILLED_EXIT_CODE, "timed_out": False}  # the command killed the agent

    async def _frame(self) -> tuple[bytes, int, bytes] | None:
        try:
            head = await self.reader.readexactly(exec_agent.HEADER.size)
            size, kind, rid = exec_agent.HEADER.unpack(head)
            return kind, rid, await self.reader.readexactly(size)
        except asyncio.IncompleteReadError:
            return None

    async def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()  # a forked agent's stub: the end of its namespace ends the agent
        self.writer.close()
        await self.proc.wait()
        with contextlib.suppress(OSError):
            if said := self.log_path.read_bytes()[-2000:]:
                log.warning("exec agent %d said: %s", self.proc.pid, said.decode(errors="replace"))
                self.log_path.unlink()


class ExecAgents:
    """The agents of this broker's local sandboxes, by sandbox id."""

    def __init__(self, zygote: AgentZygote | None = None) -> None:
        self.agents: dict[str, ExecAgent] = {}
        self.starting: dict[str, asyncio.Task[None]] = {}
        self.zygote = zygote  # None: every agent is a fresh interpreter

    async def ensure(self, sandbox_id: str, start: Callable[[], Awaitable[ExecAgent]], wait: bool = True) -> None:
        """Start the sandbox's agent (``start``: ExecAgent.start or .fork) unless it runs or is starting
        (``wait``: until it is up); a failure is logged (its commands run without it)."""
        if sandbox_id in self.agents and self.agents[sandbox_id].alive:
            return
        task = self.starting.get(sandbox_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._start(sandbox_id, start))
            self.starting[sandbox_id] = task
        if wait:
            await asyncio.shield(task)

    async def _start(self, sandbox_id: str, start: Callable[[], Awaitable[ExecAgent]]) -> None:
        try:
            if (ended := self.agents.pop(sandbox_id, None)) is not None:  # its bubblewrap was killed
                await ended.stop()
            self.agents[sandbox_id] = await start()
        except OSError as exc:  # TimeoutError included: a host this loaded is better off without
            log.warning("no exec agent in %s (%r): its commands start a bubblewrap each", sandbox_id, exc)
        finally:
            if self.starting.get(sandbox_id) is asyncio.current_task():
                del self.starting[sandbox_id]

    def take(self, sandbox_id: str) -> ExecAgent | None:
        """The sandbox's idle agent, marked busy; None when it is busy, starting or absent."""
        agent = self.agents.get(sandbox_id)
        if agent is None or agent.busy or not agent.alive:
            return None
        agent.busy = True
        return agent

    async def run(self, agent: ExecAgent, request: AgentRequest, sink: OutputSink | None,
                  fallback: Callable[[], Awaitable[ExecResult]]) -> ExecResult:  # fmt: skip
        try:
            return await agent.run(request, sink)
        except NotStarted:
            return await fallback()
        finally:
            agent.busy = False

    async def stop(self, sandbox_id: str) -> None:
        """Stop the sandbox's agent, or its start (a destroyed sandbox must not get one after)."""
        await cancel_and_wait(self.starting.pop(sandbox_id, None))
        agent = self.agents.pop(sandbox_id, None)
        if agent is not None:
            await agent.stop()

    async def close(self) -> None:
        for sandbox_id in {*self.agents, *self.starting}:
            await self.stop(sandbox_id)
        if self.zygote is not None:
            await self.zygote.close()
