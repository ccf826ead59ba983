"""Copies of a local sandbox's writable state, to start other sandboxes from (sandbox fork for groups).

Everything a sandbox can write lives under ``<sandbox>/rw`` (its workspace, ``/tmp`` and, with an
image or a seeded workspace, its overlay's upper layer). With a disk quota, that is one loop-mounted
filesystem image (``disk.py``), and a snapshot is a copy of the image's data extents, taken with the
filesystem frozen (every write flushed into the image, none made meanwhile); a child's disk is a copy
of that instead of an empty formatted image, so it costs what an empty one does plus the data, whatever
the number of files. Without one, a snapshot is a ``cp -a`` of the tree (not the overlay's work
directory). Both keep the overlay's whiteouts (0/0 character devices) and its ``trusted.overlay.*``
xattrs, so a child mounted over the copy sees the parent's deletions too. Snapshots are kept in
``<state_dir>/snapshots/<id>``. A child gets its own copy before its overlay is mounted (the
layers of a mounted overlay must not change). Processes are not carried over: a child starts idle,
as after the parent's setup, which ran to its end (its background processes died with it).

A snapshot's id names the broker process that took it (``snap-<pid>-<hex>``): several processes may
share a state directory (replicas on one host, a benchmark's own backend beside its broker), and one
that starts removes only the snapshots of processes that are gone.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

from services.sandbox_broker.backends import disk

SKIP = ("work", "lost+found")  # the overlay's scratch directory; ext4's own
IMAGE = "disk.img"  # a snapshot of a sandbox with a disk quota: its whole image


def root(state_dir: Path) -> Path:
    return state_dir / "snapshots"


def take(rw: Path, state_dir: Path, disk_image: Path | None = None) -> str:
    """Copy a sandbox's writable state; return the snapshot's id. ``disk_image``: the image ``rw``
    is mounted from, copied whole (its data extents) instead of file by file."""
    snapshot_id = f"snap-{os.getpid()}-{secrets.token_hex(8)}"
    dest = root(state_dir) / snapshot_id
    dest.mkdir(parents=True)
    try:
        if disk_image is not None:
            disk.frozen_copy(rw, disk_image, dest / IMAGE)
        elif entries := [str(p) for p in rw.iterdir() if p.name not in SKIP]:
            _cp([*entries, str(dest)])
    except OSError:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return snapshot_id


def image_of(snapshot_id: str | None, state_dir: Path, disk_quota: bool) -> Path | None:
    """The snapshot's disk image, which a new sandbox's disk is a copy of; None: no snapshot, or a
    tree (``restore``). An image needs a disk quota to be copied into."""
    if snapshot_id is None:
        return None
    path = root(state_dir) / _checked(snapshot_id) / IMAGE
    if not path.is_file():
        return None
    if not disk_quota:
        raise OSError(f"the snapshot {snapshot_id} is a disk image, and this broker has no disk quota")
    return path


def restore(snapshot_id: str, state_dir: Path, rw: Path) -> None:
    """Copy a snapshot into a new sandbox's (empty, not yet mounted over) writable state."""
    source = root(state_dir) / _checked(snapshot_id)
    if not source.is_dir():
        raise OSError(f"no snapshot {snapshot_id}")
    rw.mkdir(parents=True, exist_ok=True)
    _cp([f"{source}/.", str(rw)])


def drop(snapshot_id: str, state_dir: Path) -> None:
    shutil.rmtree(root(state_dir) / _checked(snapshot_id), ignore_errors=True)


def clean(state_dir: Path) -> None:
    """Remove the snapshots of processes that are gone (at start: a killed broker's; a live replica's
    stay, it uses them)."""
    if not root(state_dir).is_dir():
        return
    for path in root(state_dir).iterdir():
        owner = path.name.split("-")[1] if path.name.count("-") == 2 else ""
        if owner.isdigit() and int(owner) != os.getpid() and Path(f"/proc/{owner}").exists():
            continue
        shutil.rmtree(path, ignore_errors=True)


def _checked(snapshot_id: str) -> str:
    if not snapshot_id.startswith("snap-") or "/" in snapshot_id or ".." in snapshot_id:
        raise OSError(f"bad snapshot id {snapshot_id!r}")
    return snapshot_id


def _cp(argv: list[str]) -> None:
    done = subprocess.run(["cp", "-a", "--", *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OSError(f"cp -a failed: {done.stderr.strip()[-300:]}")
