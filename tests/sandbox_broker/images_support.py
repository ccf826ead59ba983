"""Small real images for tests: busybox layers with whiteouts, written as ``docker save`` tars."""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path

from services.sandbox_broker.images.archive import layer_from_dir, write_docker_archive
from services.sandbox_broker.images.sources import ImageConfig

BUSYBOX = "/bin/busybox"
APPLETS = (
    "sh",
    "ls",
    "cat",
    "id",
    "pwd",
    "echo",
    "touch",
    "rm",
    "mkdir",
    "env",
    "stat",
    "hostname",
    "whoami",
    "sleep",
    "timeout",
)  # sleep and timeout: what the docker backend runs


def busybox_image(work: Path, *, user: str = "agent", workdir: str = "/testbed") -> Path:
    """Two layers: busybox, an ``agent`` user, /testbed with a.txt, b.txt and pkg/old.py; then a
    layer that deletes b.txt (whiteout) and replaces pkg/ (opaque whiteout) with pkg/new.py."""
    base = work / "l1"
    (base / "bin").mkdir(parents=True)
    shutil.copy(BUSYBOX, base / "bin" / "busybox")
    for applet in APPLETS:
        os.symlink("busybox", base / "bin" / applet)
    (base / "etc").mkdir()
    (base / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000::/home/agent:/bin/sh\n")
    (base / "etc" / "group").write_text("root:x:0:\nagent:x:1000:\n")
    (base / "home" / "agent").mkdir(parents=True)
    (base / "testbed" / "pkg").mkdir(parents=True)
    for name in ("a.txt", "b.txt", "pkg/old.py"):
        (base / "testbed" / name).write_text(name)
    top = work / "l2"
    (top / "testbed" / "pkg").mkdir(parents=True)
    (top / "testbed" / "pkg" / "new.py").write_text("new")
    layers = [layer_from_dir(base, work / "l1.tar"), layer_from_dir(top, work / "l2.tar", whiteouts=["testbed/b.txt"])]
    with tarfile.open(layers[1], "a") as tar:
        tar.addfile(tarfile.TarInfo("testbed/pkg/.wh..wh..opq"))
    config = ImageConfig(env=("PATH=/bin", "FOO=from-image"), workdir=workdir, user=user)
    out = work / "busybox.tar"
    write_docker_archive(out, layers, config, "test/busybox:1")
    return out


CALC = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
CALC_TESTS = (
    "import unittest\n\nfrom calc import add, sub\n\n\nclass T(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
    "    def test_sub(self):\n        self.assertEqual(sub(5, 3), 2)\n"
)


def calc_repo_image(work: Path) -> Path:
    """busybox plus /testbed: a ``calc`` module whose ``add`` is wrong, and its unittest tests.
    With ``host_usr`` the sandbox gets the host's Python (this image has none of its own)."""
    busybox_image(work / "bb", user="root", workdir="/testbed")
    layer = work / "repo"
    (layer / "testbed" / "tests").mkdir(parents=True)
    (layer / "testbed" / "calc.py").write_text(CALC)
    (layer / "testbed" / "tests" / "__init__.py").write_text("")
    (layer / "testbed" / "tests" / "test_calc.py").write_text(CALC_TESTS)
    layers = [work / "bb" / "l1.tar", layer_from_dir(layer, work / "repo.tar")]
    out = work / "calc.tar"
    write_docker_archive(out, layers, ImageConfig(env=("PATH=/usr/bin:/bin", "CALC=1"), workdir="/testbed"), "t/calc:1")
    return out
