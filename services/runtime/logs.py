"""Logging set up once per process, by its entrypoint."""

from __future__ import annotations

import logging
import os

from services.runtime.settings import shared_variable

_FORMAT = "%(asctime)s %(levelname)-7s %(process)d %(name)s: %(message)s"


def configure_logging(level: str | None = None) -> None:
    """Configure the root logger at ``level`` (a process's resolved ``log_level`` setting).

    Without one (before the settings are built), the shared ``ROLLOUT_LOG_LEVEL``, else INFO.
    """
    chosen = (level or os.environ.get(shared_variable("log_level")) or "INFO").upper()
    logging.basicConfig(level=chosen, format=_FORMAT, force=True)
    for noisy in ("httpx", "httpcore", "aiohttp.access", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(chosen)))
