"""A local sandbox's disk quota: its whole writable state lives on one size-limited filesystem.

Each sandbox gets a sparse file ``<sandbox>/disk.img`` formatted as ext4 (no journal, no reserved
blocks, no blocks reserved for an online resize, inode tables initialised lazily and never in the
background) and loop-mounted on
``<sandbox>/rw`` (with the system calls: ``mounts.py``). The workspace, ``/tmp`` and the overlay's
upper and work directories (a task image's private writable layer) are directories inside it, so
everything the sandbox writes counts against ``disk_mb`` and writing past it fails with ENOSPC
inside the sandbox, while the host's filesystem and the broker are untouched. The image is sparse:
it costs only the blocks written (a fresh 10 GiB image holds about 0.2 MB), and it is deleted with
the sandbox.

The image is not formatted per sandbox: ``mkfs.ext4`` runs once per size and state directory, into
a template (:class:`DiskImages`), and each sandbox gets a sparse copy of it (its data extents only:
about a quarter of mkfs's CPU). The copies share the filesystem's UUID, which ext4, unlike XFS,
does not mind; nothing on the host mounts by UUID. Given the sandbox uid, the template already holds
the workspace and ``/tmp`` (``mkfs.ext4 -d``: the sandbox uid's, ``/tmp`` sticky and world-writable,
as ``local_prepare.layout`` makes them) and no ``lost+found`` (``debugfs``, where it is installed):
each sandbox's first writes to its filesystem (two directories made, one removed) are then done once.

Project quotas (XFS, ext4) would do the same on one shared filesystem, but need a kernel built with
quota support; a size-limited tmpfs is exact but RAM-backed. Without root (no loop mounts), ``disk``
is a plain directory and only the per-file size rlimit applies: ``/healthz`` shows ``disk_quota``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path

from services.sandbox_broker.backends import mounts

log = logging.getLogger(__name__)

MKFS = ["mkfs.ext4", "-q", "-F", "-O", "^has_journal,^resize_inode", "-m", "0", "-E", "lazy_itable_init=1,nodiscard"]
MOUNT_FLAGS = mounts.MS_NOSUID | mounts.MS_NODEV
MOUNT_OPTIONS = "noinit_itable"
KIND = "loop-ext4"
FIFREEZE, FITHAW = 0xC0045877, 0xC0045878  # _IOWR('X', 119 / 120, int)
FORMAT = hashlib.sha256(" ".join(MKFS).encode()).hexdigest()[:10]  # templates of other mkfs options are not used
SKELETON = (("workspace", 0o755), ("tmp", 0o1777))  # made in a template for a sandbox uid (bwrap.SandboxPaths)
LAYOUT = hashlib.sha256(repr(SKELETON).encode()).hexdigest()[:6]
TEMPLATES = "disk-templates"  # under the state directory


def image(root: Path) -> Path:
    return root / "disk.img"


class DiskImages:
    """Empty formatted images, one per size, made once in ``directory`` (several brokers may share
    it: each template appears by an atomic rename) and copied for each sandbox."""

    def __init__(self, directory: Path, uid: int | None = None) -> None:
        self.directory = directory
        self.uid = uid  # the owner of the workspace and /tmp made in the template; None: an empty template
        self._lock = threading.Lock()  # one mkfs per size at a time in this process

    def create(self, root: Path, mountpoint: Path, size_mb: int, source: Path | None = None) -> None:
        """Make and mount the sandbox's filesystem of ``size_mb`` MiB on ``mountpoint``: empty, or a
        copy of ``source``, another sandbox's image of that size (``frozen_copy``: a snapshot)."""
        img = image(root)
        copy_sparse(source or self.template(size_mb), img)
        if source is not None and img.stat().st_size != size_mb * 1024 * 1024:
            raise OSError(f"the snapshot {source} is not a {size_mb} MiB disk")
        mountpoint.mkdir(exist_ok=True)
        mounts.loop_mount(img, mountpoint, "ext4", MOUNT_FLAGS, MOUNT_OPTIONS)
        with contextlib.suppress(FileNotFoundError):  # a snapshot's copy has none left
            (mountpoint / "lost+found").rmdir()

    def template(self, size_mb: int) -> Path:
        layout = "" if self.uid is None else f"-{LAYOUT}-u{self.uid}"
        path = self.directory / f"ext4-{size_mb}mb-{FORMAT}{layout}.img"
        if path.is_file():
            return path
        with self._lock:
            if not path.is_file():
                self.directory.mkdir(parents=True, exist_ok=True)
                scratch = path.with_name(f"{path.name}.{os.getpid()}.tmp")
                try:
                    _format(scratch, size_mb, self.uid)
                    os.replace(scratch, path)
                finally:
                    scratch.unlink(missing_ok=True)
        return path

    def clean_leftovers(self) -> None:
        """Remove half-made templates (and their skeleton directories) of brokers that are gone."""
        for scratch in [*self.directory.glob("*.tmp"), *self.directory.glob("*.tmp.d")]:
            pid = scratch.name.removesuffix(".d").removesuffix(".tmp").rpartition(".")[2]
            if not (pid.isdigit() and Path(f"/proc/{pid}").exists()):
                if scratch.is_dir():
                    shutil.rmtree(scratch, ignore_errors=True)
                else:
                    scratch.unlink(missing_ok=True)


def _format(path: Path, size_mb: int, uid: int | None) -> None:
    with path.open("wb") as f:
        f.truncate(size_mb * 1024 * 1024)
    if uid is None:
        _run([*MKFS, str(path)], "mkfs.ext4")
        return
    skeleton = path.with_name(path.name + ".d")
    shutil.rmtree(skeleton, ignore_errors=True)
    try:
        for name, mode in SKELETON:
            (skeleton / name).mkdir(parents=True)
            os.chmod(skeleton / name, mode)
            if os.geteuid() == 0:
                os.chown(skeleton / name, uid, uid)
        _run([*MKFS, "-d", str(skeleton), str(path)], "mkfs.ext4")
    finally:
        shutil.rmtree(skeleton, ignore_errors=True)
    if shutil.which("debugfs") is not None:  # else each sandbox removes its own copy's
        _run(["debugfs", "-w", "-R", "rmdir lost+found", str(path)], "debugfs")


COPY_CHUNK = 1 << 20


def copy_sparse(source: Path, dest: Path) -> None:
    """Copy ``source`` into a new ``dest`` extent by extent: its holes stay holes. Between two
    filesystems (a sandboxes directory mounted apart from the templates' or the snapshots'), where
    ``copy_file_range`` refuses (EXDEV), the extents are read and written."""
    with source.open("rb") as src, dest.open("wb") as dst:
        size = os.fstat(src.fileno()).st_size
        position = 0
        while position < size:
            try:
                start = os.lseek(src.fileno(), position, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno != errno.ENXIO:  # ENXIO: nothing but a hole after ``position``
                    raise
                break
            end = os.lseek(src.fileno(), start, os.SEEK_HOLE)
            while start < end:
                copied = _copy_range(src.fileno(), dst.fileno(), end - start, start)
                if copied == 0:
                    raise OSError(errno.EIO, f"{source} ended early while copying it")
                start += copied
            position = end
        os.ftruncate(dst.fileno(), size)


def _copy_range(src: int, dst: int, count: int, offset: int) -> int:
    """At most ``count`` bytes from ``offset`` in ``src`` to the same offset in ``dst``; 0 at its end."""
    try:
        return os.copy_file_range(src, dst, count, offset, offset)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
    data = os.pread(src, min(count, COPY_CHUNK), offset)
    return os.pwrite(dst, data, offset) if data else 0


def frozen_copy(mountpoint: Path, source: Path, dest: Path) -> None:
    """Copy the image ``source``, mounted on ``mountpoint``, to ``dest`` as a consistent filesystem:
    frozen meanwhile (FIFREEZE: every write flushed through the loop device into ``source``, new
    ones held until the thaw)."""
    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, FIFREEZE, 0)
        try:
            copy_sparse(source, dest)
        finally:
            fcntl.ioctl(fd, FITHAW, 0)
    finally:
        os.close(fd)


def thaw_all(sandboxes: Path) -> int:
    """Thaw every sandbox filesystem a killed broker left frozen mid-snapshot (its processes' writes
    would hang); how many were. A filesystem that is not frozen answers EINVAL and stays as it is."""
    thawed = 0
    for mountpoint in sandboxes.glob("*/rw"):
        try:
            fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:  # not a directory (a sandbox half made or half removed)
            continue
        try:
            fcntl.ioctl(fd, FITHAW, 0)
            thawed += 1
        except OSError:  # EINVAL: not frozen
            pass
        finally:
            os.close(fd)
    if thawed:
        log.warning("thawed %d sandbox filesystems left frozen by a killed broker", thawed)
    return thawed


def release(root: Path, mountpoint: Path) -> None:
    """Unmount (lazily: a process still dying in it cannot block) and delete the image; idempotent."""
    mounts.detach(mountpoint)
    image(root).unlink(missing_ok=True)


def probe(scratch: Path) -> bool:
    """Whether this host lets the broker loop-mount a filesystem image (root, loop devices, mkfs)."""
    if shutil.which("mkfs.ext4") is None:
        log.info("mkfs.ext4 not found (apt-get install e2fsprogs): no disk quota, only a file-size rlimit")
        return False
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        DiskImages(scratch / TEMPLATES).create(scratch, scratch / "disk", 8)
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
