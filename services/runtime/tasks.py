"""Stopping background tasks for sure.

``task.cancel()`` followed by ``await task`` under ``suppress(CancelledError)`` has two faults: a
library that drops the cancellation (Python 3.11's ``asyncio.wait_for``, under which redis-py
writes, returns a result that completes as the cancellation arrives) leaves the task running and
the stop waiting for ever, and the ``suppress`` also swallows a cancellation of the task that is
stopping. :func:`cancel_and_wait` cancels again until the task has ended, and passes the caller's
own cancellation on.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)

RETRY_S = 1.0


async def cancel_and_wait(task: asyncio.Task[Any] | None, retry_s: float = RETRY_S) -> None:
    """Cancel ``task`` (None: nothing to do) and return once it has ended; an error it ended
    with (other than the cancellation) is logged."""
    if task is None:
        return
    tries = 0
    while not task.done():
        if tries:
            log.warning("task %s carried on after its cancellation; cancelling it again", task.get_name())
        task.cancel()
        tries += 1
        await asyncio.wait([task], timeout=retry_s)  # raises if the caller itself is cancelled
    if not task.cancelled() and task.exception() is not None:
        log.error("task %s ended with an error while stopping", task.get_name(), exc_info=task.exception())
