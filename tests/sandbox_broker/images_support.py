"""Small real images for tests: busybox layers with whiteouts, written as ``docker save`` tars."""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path

import pytest

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


PYTEST_PACKAGES = ("_pytest", "pytest", "pluggy", "iniconfig", "packaging", "py.py")  # pure Python
CALC_PYTESTS = (
    "from calc import add, sub\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_sub():\n    assert sub(5, 3) == 2\n"
)


def pytest_repo_image(work: Path) -> Path:
    """``calc_repo_image``'s repository with pytest tests, and pytest itself (this process's, pure
    Python, copied to /opt/pydeps on the image's PYTHONPATH) for the host's Python (``host_usr``)."""
    busybox_image(work / "bb", user="root", workdir="/testbed")
    layer = work / "repo"
    (layer / "testbed" / "tests").mkdir(parents=True)
    (layer / "testbed" / "calc.py").write_text(CALC)
    (layer / "testbed" / "tests" / "test_calc.py").write_text(CALC_PYTESTS)
    site = Path(pytest.__file__).parent.parent
    metadata = [
        p.name
        for p in site.glob("*.dist-info")
        if p.name.split("-")[0] in ("pytest", "pluggy", "iniconfig", "packaging")
    ]
    for name in (*PYTEST_PACKAGES, *metadata):
        source, target = site / name, layer / "opt" / "pydeps" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, target)
    layers = [work / "bb" / "l1.tar", layer_from_dir(layer, work / "repo.tar")]
    env = ("PATH=/usr/bin:/bin", "PYTHONPATH=/opt/pydeps", "PYTHONDONTWRITEBYTECODE=1")
    out = work / "pycalc.tar"
    write_docker_archive(out, layers, ImageConfig(env=env, workdir="/testbed"), "t/pycalc:1")
    return out
