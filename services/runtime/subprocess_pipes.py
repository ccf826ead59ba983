"""Closing an asyncio subprocess's pipes when its output is no longer wanted."""

from __future__ import annotations

import asyncio


def close_pipes(proc: asyncio.subprocess.Process) -> None:
    """Close the process's pipes and its transport now. Left to the garbage collector, a pipe that
    another process keeps open (a grandchild that outlived a kill: no end of file came) stays
    registered with the event loop, its descriptor open, and warns as an unclosed transport once
    the loop is gone. Closing a finished process's transport again does nothing."""
    transport = getattr(proc, "_transport", None)  # asyncio's Process keeps its transport private
    if transport is not None:
        transport.close()
