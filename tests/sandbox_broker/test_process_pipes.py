"""A command that times out while a process it started keeps its stdout and stderr open: the run
still ends (the grace after the kill), and its pipes are closed, not left to the garbage collector
(which warned of unclosed transports in whatever test ran next, after the event loop was gone)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import warnings
from pathlib import Path

import pytest

from services.runtime.subprocess_pipes import close_pipes
from services.sandbox_broker.backends.process import TIMEOUT_EXIT_CODE, run_process

pytestmark = pytest.mark.slow  # the run waits out its 5 s grace for the pipes


def test_a_timed_out_command_whose_grandchild_holds_its_pipes_leaves_no_transport_open(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    script = f"sleep 60 & echo $! > {pidfile}; exec sleep 60"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = asyncio.run(run_process(["sh", "-c", script], env=dict(os.environ), timeout_s=0.5,
                                             max_output_bytes=1000))  # fmt: skip
            gc.collect()
        assert result.exit_code == TIMEOUT_EXIT_CODE and result.timed_out
        assert pidfile.read_text().strip()  # the grandchild was there, holding the pipes
        leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        assert leaks == []
    finally:
        if pidfile.is_file():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def test_closing_a_finished_processes_pipes_again_does_nothing() -> None:
    async def run() -> int:
        proc = await asyncio.create_subprocess_exec("true", stdout=asyncio.subprocess.PIPE)
        await proc.communicate()
        close_pipes(proc)
        close_pipes(proc)
        return proc.returncode or 0

    assert asyncio.run(run()) == 0
