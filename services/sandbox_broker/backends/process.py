"""Run one command as a child process: stdin in, capped stdout/stderr out, a deadline that kills it."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from services.protocol.sandboxes import ExecResult
from services.runtime.subprocess_pipes import close_pipes
from services.sandbox_broker.backends.base import OutputBuffer, OutputSink

TIMEOUT_EXIT_CODE = 124
READ_CHUNK = 65_536


def watch_children_with_pidfds() -> None:
    """On 3.11, watch child processes through pidfds on the running loop instead of one thread each
    (what 3.12 does by default): hundreds of concurrent commands, no hundreds of threads."""
    if sys.version_info >= (3, 12) or not hasattr(asyncio, "PidfdChildWatcher"):
        return
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(asyncio.get_running_loop())
    asyncio.get_event_loop_policy().set_child_watcher(watcher)


async def run_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout_s: float,
    max_output_bytes: int,
    stdin: bytes | None = None,
    cwd: str | None = None,
    sink: OutputSink | None = None,
    on_timeout: Callable[[], None] | None = None,
) -> ExecResult:
    """Run ``argv`` to completion or to ``timeout_s``; on timeout SIGKILL it (and call ``on_timeout``,
    which kills whatever else belongs to the command) and report exit code 124."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
    )
    out, err = OutputBuffer(max_output_bytes), OutputBuffer(max_output_bytes)
    assert proc.stdout is not None and proc.stderr is not None
    work = asyncio.gather(
        _feed(proc, stdin),
        _drain(proc.stdout, out, "stdout", sink),
        _drain(proc.stderr, err, "stderr", sink),
        proc.wait(),
    )
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.shield(work), timeout_s)
    except TimeoutError:
        timed_out = True
        _kill(proc)
        if on_timeout is not None:
            on_timeout()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(work), 5)
    except asyncio.CancelledError:
        _kill(proc)
        if on_timeout is not None:
            on_timeout()
        raise
    finally:
        if not work.done():
            work.cancel()
            with contextlib.suppress(BaseException):
                await work
            close_pipes(proc)  # a process that outlived the kill (a grandchild) holds them: stop reading
    code = proc.returncode if proc.returncode is not None else -9
    return ExecResult(
        exit_code=TIMEOUT_EXIT_CODE if timed_out else code,
        stdout=out.text(),
        stderr=err.text(),
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
    )


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


async def _feed(proc: asyncio.subprocess.Process, data: bytes | None) -> None:
    if data is None or proc.stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.write(data)
        await proc.stdin.drain()
    proc.stdin.close()


async def _drain(stream: asyncio.StreamReader, buffer: OutputBuffer, name: str, sink: OutputSink | None) -> None:
    while chunk := await stream.read(READ_CHUNK):
        buffer.add(chunk)
        if sink is not None:
            await sink(name, chunk)
