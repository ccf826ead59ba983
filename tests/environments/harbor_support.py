"""The Harbor fixture set (tests/environments/harbor_tasks: Terminal-Bench-style tasks written for
these tests) and the shared base their ``FROM ubuntu:24.04`` maps to here: busybox with all its
applets, run with the host's /usr (python3, bash, git), so that building needs no registry."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from services.sandbox_broker.images.archive import layer_from_dir, write_docker_archive
from services.sandbox_broker.images.sources import ImageConfig

TASKS = Path(__file__).parent / "harbor_tasks"
BUSYBOX = "/bin/busybox"


def task_dirs() -> list[Path]:
    return sorted(p for p in TASKS.iterdir() if (p / "task.toml").is_file())


def busybox_base(work: Path) -> Path:
    """A one-layer docker save tar: /bin/busybox and a link per applet, root's passwd, /tmp."""
    root = work / "base-root"
    (root / "bin").mkdir(parents=True)
    shutil.copy(BUSYBOX, root / "bin" / "busybox")
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if applet != "busybox":
            os.symlink("busybox", root / "bin" / applet)
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    for name in ("root", "tmp"):
        (root / name).mkdir(mode=0o1777 if name == "tmp" else 0o700)
    out = work / "base.tar"
    config = ImageConfig(env=("PATH=/usr/local/bin:/usr/bin:/bin",), workdir="/", user="root")
    write_docker_archive(out, [layer_from_dir(root, work / "base-layer.tar")], config, "test/busybox-full:1")
    return out
