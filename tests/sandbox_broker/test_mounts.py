"""Detaching mounts by name (mounts.detach) never follows a symbolic link: the names lie in trees a
sandbox wrote, and a link planted there must not detach one of the host's mounts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from services.sandbox_broker.backends import mounts

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def test_a_link_to_a_mount_point_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "host-mount"
    target.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(target)], check=True)
    link = tmp_path / "planted"
    link.symlink_to(target)
    try:
        assert mounts.detach(link) is False
        assert str(target) in mounts.mount_points()  # the host's mount is still there
        assert mounts.detach(target) is True
        assert str(target) not in mounts.mount_points()
    finally:
        mounts.detach(target)
