"""Scratch directories that outlive a killed owner only until the next owner starts.

A ``TemporaryDirectory`` is removed when its ``with`` block ends, which a process killed with
SIGKILL never reaches: its directory stays in ``/tmp`` for good. Here the owner holds an ``flock``
on a file inside its directory for as long as it runs (the kernel drops the lock when the owner's
last descriptor closes, however it ends), and each new owner first removes the directories of the
same prefix whose lock it can take: those whose owner is gone. A lock works across PID namespaces
that share the directory, which a PID check would not.

The lock file appears under its final name already locked (made under a temporary name, locked,
then renamed), so a sweep never mistakes a starting owner's directory for an abandoned one.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = ".owner.lock"
log = logging.getLogger(__name__)


@contextmanager
def owned_tempdir(prefix: str, base: Path | None = None) -> Iterator[str]:
    """A new directory ``<base>/<prefix>XXXXXXXX`` (base: the system's temp dir), removed at the end;
    first, the directories of this prefix that a killed owner left are removed."""
    root = Path(base) if base is not None else Path(tempfile.gettempdir())
    removed = sweep(prefix, root)
    if removed:
        log.info("removed %d directories of %s* that their killed owners left", removed, prefix)
    path = tempfile.mkdtemp(prefix=prefix, dir=root)
    fd = _lock(Path(path))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


def sweep(prefix: str, root: Path) -> int:
    """Remove ``root/<prefix>*`` directories whose owner no longer holds their lock; returns how many.
    A directory with no lock file (being made, or made by other code) is left alone."""
    removed = 0
    for path in root.glob(f"{prefix}*"):
        try:
            fd = os.open(path / LOCK, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue  # not a directory of ours, or no lock file (yet)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its owner runs
        finally:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


def _lock(path: Path) -> int:
    """Lock ``path/LOCK`` for the caller's lifetime: made under another name, locked, then renamed.
    The descriptor is inherited by forks (they hold the lock too) and closed by exec."""
    staging = path / f"{LOCK}.{os.getpid()}"
    fd = os.open(staging, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(staging, path / LOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd
