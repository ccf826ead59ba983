"""A local sandbox's disk quota: its whole writable state lives on one size-limited filesystem.

Each sandbox gets a sparse file ``<sandbox>/disk.img`` formatted as ext4 (no journal, no reserved
blocks, inode tables initialised lazily and never in the background) and loop-mounted on
``<sandbox>/disk``. The workspace, ``/tmp`` and the overlay's upper and work directories (a task
image's private writable layer) are directories inside it, so everything the sandbox writes counts
against ``disk_mb`` and writing past it fails with ENOSPC inside the sandbox, while the host's
filesystem and the broker are untouched. The image is sparse: it costs only the blocks written
(a fresh 10 GiB image holds about 4 MB), and it is deleted with the sandbox.

Project quotas (XFS, ext4) would do the same on one shared filesystem, but need a kernel built with
quota support; a size-limited tmpfs is exact but RAM-backed. Without root (no loop mounts), ``disk``
is a plain directory and only the per-file size rlimit applies: ``/healthz`` shows ``disk_quota``.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

from services.sandbox_broker.backends.overlay import mounted

log = logging.getLogger(__name__)

MKFS = ["mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-m", "0", "-E", "lazy_itable_init=1,nodiscard"]
MOUNT_OPTIONS = "loop,noinit_itable,nosuid,nodev"
KIND = "loop-ext4"


def image(root: Path) -> Path:
    return root / "disk.img"


def create(root: Path, mountpoint: Path, size_mb: int) -> None:
    """Make and mount the sandbox's filesystem of ``size_mb`` MiB on ``mountpoint``."""
    img = image(root)
    with img.open("wb") as f:
        f.truncate(size_mb * 1024 * 1024)
    _run([*MKFS, str(img)], "mkfs.ext4")
    mountpoint.mkdir(exist_ok=True)
    _run(["mount", "-t", "ext4", "-o", MOUNT_OPTIONS, str(img), str(mountpoint)], "mount")
    (mountpoint / "lost+found").rmdir()


def release(root: Path, mountpoint: Path) -> None:
    """Unmount (lazily: a process still dying in it cannot block) and delete the image; idempotent."""
    if mounted(mountpoint):
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, check=False)
    image(root).unlink(missing_ok=True)


def probe(scratch: Path) -> bool:
    """Whether this host lets the broker loop-mount a filesystem image (root, loop devices, mkfs)."""
    if shutil.which("mkfs.ext4") is None:
        log.info("mkfs.ext4 not found (apt-get install e2fsprogs): no disk quota, only a file-size rlimit")
        return False
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        create(scratch, scratch / "disk", 8)
        return True
    except OSError as exc:
        log.info("no loop-mounted disk quota here (%s): only a file-size rlimit", exc)
        return False
    finally:
        release(scratch, scratch / "disk")
        shutil.rmtree(scratch, ignore_errors=True)


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OSError(f"{what} failed: {done.stderr.strip()[-300:]}")
