"""Container monitor processes (containerd shims, podman's conmon) left behind by containers that
no longer exist: found in /proc by the engine's exec root and the container id, then killed."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

log = logging.getLogger(__name__)

MONITORS = (b"containerd-shim", b"conmon")


def leftover_monitors(exec_root: str, containers: set[str], kill: bool) -> list[int]:
    """Pids of monitors under ``exec_root`` whose container is not in ``containers`` (killed if ``kill``)."""
    found = []
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
        if container and not any(c.startswith(container) for c in containers):
            found.append(int(entry.name))
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
