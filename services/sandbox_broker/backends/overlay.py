"""Template root filesystems as a shared read-only layer under each sandbox's private workspace
(kernel overlayfs, where the host lets the broker mount), else copied into the workspace."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path

log = logging.getLogger(__name__)

_lock = threading.Lock()  # one layer preparation at a time in this process


def mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mountinfo") as mountinfo:
        return any(line.split()[4] == target for line in mountinfo)


def mount(lower: Path, upper: Path, work: Path, merged: Path) -> None:
    options = f"lowerdir={lower},upperdir={upper},workdir={work}"
    done = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise OSError(f"overlay mount on {merged} failed: {done.stderr.strip()}")


def unmount(merged: Path) -> None:
    if mounted(merged):
        subprocess.run(["umount", "-l", str(merged)], capture_output=True, check=False)


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


def layer(layers: Path, rootfs: Path, uid: int) -> Path:
    """A copy of ``rootfs`` owned by the sandbox uid, made once per rootfs version and shared by its
    sandboxes as their lower layer (so the sandbox user can change any file, in its own upper layer)."""
    stamp = f"{rootfs.resolve()}:{rootfs.stat().st_mtime_ns}"
    path = layers / hashlib.sha256(stamp.encode()).hexdigest()[:16]
    with _lock:
        if path.is_dir():
            return path
        staging = layers / f".{path.name}.{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(rootfs, staging, symlinks=True)
        chown_tree(staging, uid)
        try:
            staging.rename(path)
        except OSError:  # another replica made it first
            shutil.rmtree(staging, ignore_errors=True)
    return path


def chown_tree(root: Path, uid: int) -> None:
    if os.geteuid() != 0:
        return
    os.chown(root, uid, uid, follow_symlinks=False)
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            os.chown(Path(directory) / name, uid, uid, follow_symlinks=False)
