"""Logging set up once per process, by its entrypoint."""

from __future__ import annotations

import contextlib
import faulthandler
import io
import logging
import os
import signal

_FORMAT = "%(asctime)s %(levelname)-7s %(process)d %(name)s: %(message)s"
# ``kill -USR2 PID``: the process writes every thread's stack to its stderr (its log) and goes on; a
# stop that outlives its grace asks for them before its SIGKILL (``processes.stop_group``)
STACKS_SIGNAL = signal.SIGUSR2


def configure_logging(level: str | None = None) -> None:
    """Configure the root logger at ``level`` (a process's resolved ``log_level`` setting).

    Without one (before the settings are built), the shared ``ROLLOUT_LOG_LEVEL``, else INFO.
    """
    from services.runtime.settings import shared_variable  # here: importing STACKS_SIGNAL loads no pydantic

    chosen = (level or os.environ.get(shared_variable("log_level")) or "INFO").upper()
    logging.basicConfig(level=chosen, format=_FORMAT, force=True)
    for noisy in ("httpx", "httpcore", "aiohttp.access", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(chosen)))
    # a crash in C code (a segfault, an abort) and STACKS_SIGNAL leave every thread's Python stack in
    # the log; not where stderr has no descriptor (a test's captured stream in the test's own process)
    with contextlib.suppress(io.UnsupportedOperation, AttributeError, ValueError):
        faulthandler.enable(all_threads=True)
        faulthandler.register(STACKS_SIGNAL, all_threads=True)
