"""What a local broker killed in the middle of its start-up probes leaves behind, and its removal.

Each probe works in ``<state_dir>/<kind>-probe-<pid>``: a loop-mounted disk image (``disk``), a
network namespace with its slirp4netns process (``netns``), an overlay mount (``overlay``). A broker
killed mid-probe leaves these mounted (and slirp4netns running); the next broker on the same state
directory removes every probe directory whose broker is gone before it probes again.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from services.sandbox_broker.backends import disk, netns, overlay

log = logging.getLogger(__name__)

KINDS = ("overlay", "disk", "netns")


def probe_dir(state_dir: Path, kind: str, pid: int) -> Path:
    return state_dir / f"{kind}-probe-{pid}"


def clean_probes(state_dir: Path) -> list[Path]:
    """Remove the probe directories of brokers that are gone (their mounts, namespace, slirp4netns)."""
    removed = []
    for kind in KINDS:
        for path in state_dir.glob(f"{kind}-probe-*"):
            pid = path.name.rpartition("-")[2]
            if pid.isdigit() and Path(f"/proc/{pid}").exists():
                continue  # a live broker's probe, now
            netns.close_namespace(path)
            overlay.unmount_under(path)
            disk.release(path, path / "disk")
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        log.info("removed %d probe directories left by killed brokers: %s", len(removed), [p.name for p in removed])
    return removed
