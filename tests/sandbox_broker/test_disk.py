"""A sandbox's disk quota (``disk.py``, ``mounts.py``): a sparse copy of a template formatted once per
size, loop-mounted and detached with the system calls; each copy a filesystem of its own (the
shared UUID notwithstanding), the size enforced, no loop device left bound after the detach."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from services.sandbox_broker.backends import disk, mounts
from services.sandbox_broker.backends.leftovers import probe_dir

SIZE_MB = 64


def _loop_devices_freed(roots: list[Path], within_s: float) -> bool:
    """Whether the loop devices of the sandboxes' images are gone within ``within_s``: a lazy unmount
    returns at once, and the kernel frees an autoclear device when the filesystem is really released,
    which on a loaded host comes a moment later."""
    deadline = time.monotonic() + within_s
    while any(_bound_loop_devices(disk.image(root)) for root in roots):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _bound_loop_devices(image: Path) -> list[str]:
    """Loop devices whose backing file is ``image`` (as the kernel reports them)."""
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            if backing.read_text().strip().removesuffix(" (deleted)") == str(image):
                found.append(backing.parent.parent.name)
        except OSError:
            continue
    return found


@pytest.fixture
def disks(state_dir: Path) -> disk.DiskImages:
    if not disk.probe(probe_dir(state_dir, "disk", os.getpid())):
        pytest.skip("no loop mounts here (not root, no loop devices or no mkfs.ext4)")
    return disk.DiskImages(state_dir / disk.TEMPLATES)


def test_a_sparse_copy_keeps_the_holes(tmp_path: Path) -> None:
    source, dest = tmp_path / "a.img", tmp_path / "b.img"
    with source.open("wb") as f:
        f.truncate(1 << 30)
        f.write(b"head")
        f.seek(5 << 20)
        f.write(b"middle" * 1000)
    disk.copy_sparse(source, dest)
    assert dest.stat().st_size == 1 << 30 and dest.read_bytes()[:4] == b"head"
    with dest.open("rb") as f:
        f.seek(5 << 20)
        assert f.read(6000) == b"middle" * 1000
    assert dest.stat().st_blocks * 512 < 1 << 20  # holes, not a gigabyte of zeros


def test_a_sparse_copy_between_two_filesystems_reads_and_writes(tmp_path: Path) -> None:
    """copy_file_range refuses to copy between two filesystems (EXDEV): a sandboxes directory on a
    tmpfs of its own, beside templates on the host's disk, still gets its copies, holes kept."""
    other = tmp_path / "tmpfs"
    other.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(other)], check=False).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        source, dest = tmp_path / "a.img", other / "b.img"
        with source.open("wb") as f:
            f.truncate(32 << 20)
            f.seek(3 << 20)
            f.write(b"extent" * 500_000)  # 3 MB: more than one read and write
        with source.open("rb") as src, dest.open("wb") as dst:
            try:  # Linux 5.19 and later refuse it (this host's 6.x does); 5.3 to 5.18 copied
                os.copy_file_range(src.fileno(), dst.fileno(), 4096, 3 << 20, 3 << 20)
            except OSError as exc:
                assert exc.errno == errno.EXDEV
        disk.copy_sparse(source, dest)
        assert dest.stat().st_size == 32 << 20 and dest.read_bytes() == source.read_bytes()
        assert dest.stat().st_blocks * 512 < 8 << 20  # the holes stayed holes
    finally:
        subprocess.run(["umount", "-l", str(other)], check=False)


def test_each_sandbox_gets_its_own_filesystem_from_one_template(disks: disk.DiskImages, state_dir: Path) -> None:
    roots = [state_dir / f"sbx-{i}" for i in range(2)]
    try:
        for root in roots:
            root.mkdir()
            disks.create(root, root / "rw", SIZE_MB)
        assert len(list(disks.directory.iterdir())) == 1  # formatted once, copied twice
        points = mounts.mount_points()
        assert all(str(root / "rw") in points for root in roots)
        assert all(not (root / "rw" / "lost+found").exists() for root in roots)
        (roots[0] / "rw" / "mine").write_text("0")
        assert not (roots[1] / "rw" / "mine").exists()  # two filesystems, although one UUID
        with pytest.raises(OSError) as full, (roots[1] / "rw" / "big").open("wb") as big:
            for _ in range(SIZE_MB + 1):
                big.write(b"x" * (1 << 20))
                big.flush()
                os.fsync(big.fileno())
        assert full.value.errno == errno.ENOSPC  # the quota, not the host's disk
        assert all(_bound_loop_devices(disk.image(root)) for root in roots)
    finally:
        for root in roots:
            disk.release(root, root / "rw")
    assert not [p for p in mounts.mount_points() if p.startswith(str(state_dir))]
    assert _loop_devices_freed(roots, within_s=30.0)  # autoclear freed them


def test_a_frozen_copy_of_a_mounted_disk_holds_what_was_just_written(disks: disk.DiskImages, state_dir: Path) -> None:
    """A snapshot of a sandbox's disk (``frozen_copy``): what its processes wrote a moment before, still
    in the page cache and not in the image file yet, is in the copy; a disk made from the copy has it,
    and is a filesystem of its own from then on."""
    parent, child = state_dir / "parent", state_dir / "child"
    snapshot = state_dir / "snapshot.img"
    try:
        parent.mkdir()
        disks.create(parent, parent / "rw", SIZE_MB)
        (parent / "rw" / "repo").mkdir()
        payload = os.urandom(3 << 20)
        (parent / "rw" / "repo" / "data").write_bytes(payload)  # no fsync: the freeze flushes it
        disk.frozen_copy(parent / "rw", disk.image(parent), snapshot)
        (parent / "rw" / "after").write_text("thawed")  # writable again once copied
        child.mkdir()
        disks.create(child, child / "rw", SIZE_MB, source=snapshot)
        assert (child / "rw" / "repo" / "data").read_bytes() == payload
        assert not (child / "rw" / "after").exists()
        (child / "rw" / "repo" / "data").write_text("the child's")
        assert (parent / "rw" / "repo" / "data").read_bytes() == payload
        with pytest.raises(OSError, match="not a 65 MiB disk"):
            disks.create(state_dir, state_dir / "rw", SIZE_MB + 1, source=snapshot)
    finally:
        for root in (parent, child, state_dir):
            disk.release(root, root / "rw")


def test_a_start_thaws_a_disk_a_killed_broker_left_frozen(disks: disk.DiskImages, state_dir: Path) -> None:
    sandboxes = state_dir / "sandboxes"
    roots = [sandboxes / f"sbx-{i}" for i in range(2)]
    try:
        for root in roots:
            root.mkdir(parents=True)
            disks.create(root, root / "rw", SIZE_MB)
        fd = os.open(roots[0] / "rw", os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, disk.FIFREEZE, 0)  # as a snapshot does, then the broker is killed
            assert disk.thaw_all(sandboxes) == 1  # the frozen one; the other was not
            fcntl.ioctl(fd, disk.FIFREEZE, 0)  # EBUSY if it were still frozen
            fcntl.ioctl(fd, disk.FITHAW, 0)
        finally:
            os.close(fd)
        (roots[0] / "rw" / "written").write_text("after the thaw")
    finally:
        for root in roots:
            disk.release(root, root / "rw")


def test_detaching_what_is_not_mounted_does_nothing(tmp_path: Path) -> None:
    assert mounts.detach(tmp_path) is False and mounts.detach(tmp_path / "absent") is False
    assert tmp_path.is_dir()


def test_a_half_made_template_of_a_gone_broker_is_removed(disks: disk.DiskImages) -> None:
    disks.directory.mkdir(parents=True, exist_ok=True)
    mine = disks.directory / f"ext4-8mb-{disk.FORMAT}.img.{os.getpid()}.tmp"
    gone = disks.directory / f"ext4-8mb-{disk.FORMAT}.img.{2**22 + 12345}.tmp"
    for scratch in (mine, gone):
        scratch.write_bytes(b"")
    skeletons = [Path(f"{scratch}.d") for scratch in (mine, gone)]  # a template's directories, half made
    for skeleton in skeletons:
        (skeleton / "workspace").mkdir(parents=True)
    disks.clean_leftovers()
    assert mine.exists() and not gone.exists()
    assert skeletons[0].is_dir() and not skeletons[1].exists()


def test_a_template_for_the_sandbox_uid_holds_its_workspace_and_tmp(state_dir: Path) -> None:
    """Made once in the template (``mkfs.ext4 -d``), not in each sandbox's copy: the workspace and
    /tmp as the layout makes them, the sandbox uid's, and no lost+found (``debugfs``)."""
    if not disk.probe(probe_dir(state_dir, "disk", os.getpid())):
        pytest.skip("no loop mounts here (not root, no loop devices or no mkfs.ext4)")
    disks, root = disk.DiskImages(state_dir / disk.TEMPLATES, uid=1000), state_dir / "sbx"
    root.mkdir()
    try:
        disks.create(root, root / "rw", SIZE_MB)
        found = {p.name: p.stat() for p in (root / "rw").iterdir()}
        assert sorted(found) == ["tmp", "workspace"]  # no lost+found: removed in the template
        assert (found["workspace"].st_uid, found["workspace"].st_gid) == (1000, 1000)
        assert stat.S_IMODE(found["workspace"].st_mode) == 0o755
        assert (found["tmp"].st_uid, stat.S_IMODE(found["tmp"].st_mode)) == (1000, 0o1777)
        assert "-u1000.img" in disks.template(SIZE_MB).name  # apart from another uid's, or an empty one's
        assert disks.template(SIZE_MB) != disk.DiskImages(disks.directory).template(SIZE_MB)
    finally:
        disk.release(root, root / "rw")


def test_a_large_empty_disk_costs_the_host_a_fraction_of_a_megabyte(disks: disk.DiskImages, tmp_path: Path) -> None:
    """No blocks reserved for an online resize (a sandbox's quota never grows): a 10 GiB template
    held 4.3 MB of them, copied and written back for every cold sandbox."""
    template = disks.template(10 * 1024)
    assert template.stat().st_size == 10 << 30
    assert template.stat().st_blocks * 512 < 1 << 20
    disk.copy_sparse(template, copy := tmp_path / "copy.img")
    assert copy.stat().st_blocks * 512 < 1 << 20
