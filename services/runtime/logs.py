"""Logging set up once per process, by its entrypoint."""

from __future__ import annotations

import logging
import os

_FORMAT = "%(asctime)s %(levelname)-7s %(process)d %(name)s: %(message)s"


def configure_logging(level: str | None = None) -> None:
    """Configure the root logger; ``ROLLOUT_LOG_LEVEL`` overrides the default (INFO)."""
    chosen = (level or os.environ.get("ROLLOUT_LOG_LEVEL") or "INFO").upper()
    logging.basicConfig(level=chosen, format=_FORMAT, force=True)
    for noisy in ("httpx", "httpcore", "aiohttp.access", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(chosen)))
