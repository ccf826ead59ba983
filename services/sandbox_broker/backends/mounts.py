"""Mounts of local sandboxes made and removed with the system calls themselves, and the host's mount
table read once per question.

``mount -o loop`` and ``umount -l`` are processes of their own (about 6 and 3 ms of CPU each here,
libmount scanning every loop device and the mount table each time); a sandbox's loop-mounted disk
(``disk.py``) needs one of each. Here a loop device is claimed and bound to the image as ``mount``
does it (``LOOP_CTL_GET_FREE``, then ``LOOP_CONFIGURE`` with autoclear, so that the device detaches
itself when the filesystem is unmounted), the filesystem is mounted with ``mount(2)`` and detached
with ``umount2(MNT_DETACH)``, exactly what ``umount -l`` asks the kernel for.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
from pathlib import Path

LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A  # Linux 5.8: bind the backing file and set its flags in one call
LO_FLAGS_AUTOCLEAR = 4
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MNT_DETACH = 0x2
UMOUNT_NOFOLLOW = 0x8
CLAIM_TRIES = 100  # another thread or process may claim the free device first: take the next one
# struct loop_info64: device, inode, rdevice, offset, sizelimit (u64); number, encrypt_type,
# encrypt_key_size, flags (u32); file_name, crypt_name (64 bytes), encrypt_key (32); init (2 x u64)
LOOP_INFO64 = struct.Struct("=5Q4I64s64s32s2Q")
LOOP_CONFIG_RESERVED = 8 * 8  # struct loop_config: fd, block_size (u32), loop_info64, __reserved[8] (u64)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def mount_points() -> list[str]:
    """Every mount point of this process's mount namespace, from one read of its mount table."""
    with open("/proc/self/mountinfo", "rb") as mountinfo:
        table = mountinfo.read().decode(errors="surrogateescape")
    return [line.split(" ", 5)[4].replace("\\040", " ") for line in table.splitlines() if line]


def points_under(path: Path, points: list[str] | None = None) -> list[Path]:
    """Mount points at or below ``path`` (absolute), deepest first (``points``: a table already read)."""
    top = str(path.absolute())
    inside = {p for p in (mount_points() if points is None else points) if p == top or p.startswith(top + "/")}
    return [Path(p) for p in sorted(inside, key=len, reverse=True)]


def detach(target: Path) -> bool:
    """``umount -l``: detach the mount now, free it once nothing uses it. False where nothing was
    detached (not a mount point, gone, or not allowed), which, like ``umount -l``'s failures
    before, callers check by reading the mount table where it matters (``leftovers.py``). A symbolic
    link at ``target`` is never followed: the paths named here lie in trees a sandbox wrote, and a
    link there must not detach a mount of the host's."""
    return bool(_libc.umount2(os.fsencode(target), MNT_DETACH | UMOUNT_NOFOLLOW) == 0)


def loop_mount(image: Path, target: Path, fstype: str, flags: int, options: str) -> None:
    """``mount -t fstype -o loop,options image target``: a free loop device bound to ``image``
    (autoclear: it goes away with the mount), then the filesystem on it mounted on ``target``."""
    control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(CLAIM_TRIES):
            device = f"/dev/loop{fcntl.ioctl(control, LOOP_CTL_GET_FREE)}"
            fd = _claim(device, backing, image)
            if fd is None:
                continue
            try:
                _mount(device, target, fstype, flags, options)
            except OSError:
                _release(fd)
                raise
            finally:
                os.close(fd)  # the mount holds the device now: autoclear frees it at unmount
            return
        raise OSError(errno.EBUSY, f"no free loop device for {image} after {CLAIM_TRIES} tries")
    finally:
        os.close(backing)
        os.close(control)


def _claim(device: str, backing: int, image: Path) -> int | None:
    """The open device bound to the image, or None when another claimed it first."""
    fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    name = os.fsencode(image)[: 64 - 1]
    info = LOOP_INFO64.pack(0, 0, 0, 0, 0, 0, 0, 0, LO_FLAGS_AUTOCLEAR, name, b"", b"", 0, 0)
    config = struct.pack("=II", backing, 0) + info + bytes(LOOP_CONFIG_RESERVED)
    try:
        fcntl.ioctl(fd, LOOP_CONFIGURE, config)
    except OSError as exc:
        os.close(fd)
        if exc.errno == errno.EBUSY:
            return None
        raise
    return fd


def _release(fd: int) -> None:
    """Unbind a claimed device whose mount failed (``LOOP_CLR_FD``)."""
    try:
        fcntl.ioctl(fd, 0x4C01)
    except OSError:
        pass


def bind(source: Path, target: Path) -> None:
    """``mount --bind source target``."""
    _mount(str(source), target, "none", MS_BIND, "")


def unshare_private_mounts() -> None:
    """``unshare --mount --propagation private`` for the calling thread: a mount namespace of its own
    (and its own root and working directory), every mount in it private, recursively."""
    unshare(CLONE_NEWNS)
    if _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"make / rprivate: {os.strerror(code)}")


def unshare(flags: int) -> None:
    """unshare(2) for the calling thread."""
    if _libc.unshare(flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"unshare({flags:#x}): {os.strerror(code)}")


def _mount(source: str, target: Path, fstype: str, flags: int, options: str) -> None:
    if _libc.mount(source.encode(), os.fsencode(target), fstype.encode(), flags, options.encode()) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount {source} on {target}: {os.strerror(code)}")
