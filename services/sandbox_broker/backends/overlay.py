"""Kernel overlay mounts: an image tree as the shared read-only layer under a sandbox's private
upper layer (where the host lets the broker mount), and finding the mounts a dead broker left."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

from services.sandbox_broker.backends import mounts
from services.sandbox_broker.images.unpack import chown_tree

__all__ = ["chown_tree", "mount", "mounted", "mounts_under", "probe", "unmount", "unmount_under"]

log = logging.getLogger(__name__)


def mounted(path: Path) -> bool:
    return str(path.absolute()) in mounts.mount_points()


def mount(lower: Path | str, upper: Path, work: Path, merged: Path) -> None:
    """``lower``: one directory, or several joined by ":" (top first)."""
    options = f"lowerdir={lower},upperdir={upper},workdir={work}"
    done = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise OSError(f"overlay mount on {merged} failed: {done.stderr.strip()}")


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path`` (absolute), deepest first."""
    return mounts.points_under(path)


def unmount_under(path: Path) -> int:
    """Detach every mount at or below ``path`` (one read of the mount table); how many there were."""
    found = mounts.points_under(path)
    for point in found:
        mounts.detach(point)
    return len(found)


def unmount(merged: Path) -> None:
    mounts.detach(merged)


def probe(scratch: Path) -> bool:
    """Whether an overlay can be mounted here (root, kernel support, no seccomp in the way)."""
    dirs = [scratch / d for d in ("lower", "upper", "work", "merged")]
    try:
        for d in dirs:
            d.mkdir(parents=True, exist_ok=True)
        mount(*dirs)
        unmount(dirs[3])
        return True
    except OSError as exc:
        log.info("overlayfs unavailable (%s): template root filesystems will be copied", exc)
        return False
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
