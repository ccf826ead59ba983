"""Container monitor processes (containerd shims, podman's conmon) left behind by containers that
no longer exist: found in /proc by the engine's exec root and the container id, then killed."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

MONITORS = (b"containerd-shim", b"conmon")


def leftover_monitors(exec_root: str, containers: set[str] | Callable[[], set[str]], kill: bool) -> list[int]:
    """Pids of monitors under ``exec_root`` whose container is not in ``containers`` (killed if ``kill``).

    ``containers`` is best a function that lists the engine's containers: it is called after /proc
    was read, so a container created meanwhile (its monitor already running) is in the list. A set
    taken before the scan misses such a container, and killing its monitor kills the container: every
    command in it ends with SIGKILL (exit 137) and its root mount goes (exec 126 "unable to find user"),
    as a broker's orphan pass did to containers still being set up."""
    candidates: list[tuple[int, str]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not any(m in argv[0] for m in MONITORS) or not any(exec_root.encode() in a for a in argv):
            continue
        container = _container_id(argv)
        if container:
            candidates.append((int(entry.name), container))
    if not candidates:
        return []
    known = containers() if callable(containers) else containers
    found = [pid for pid, container in candidates if not any(c.startswith(container) for c in known)]
    for pid in found:
        log.warning("container monitor %d outlived its container%s", pid, "; killing it" if kill else "")
        if kill:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return found


def _container_id(argv: list[bytes]) -> str | None:
    for flag in (b"-id", b"--cid", b"-c"):
        if flag in argv[:-1]:
            return argv[argv.index(flag) + 1].decode(errors="replace")
    return None
