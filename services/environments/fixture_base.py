"""An offline base image for task sets written for tests and benchmarks (the Harbor fixture set's
``FROM ubuntu:24.04`` maps to it there): busybox with every applet it has, user root, to be run
with the host's /usr (``host_usr`` templates: python3, bash, git). Building it needs no registry."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from services.sandbox_broker.images.archive import layer_from_dir, write_docker_archive
from services.sandbox_broker.images.sources import ImageConfig

BUSYBOX = "/bin/busybox"
HARBOR_FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "environments" / "harbor_tasks"


def busybox_base(work: Path) -> Path:
    """A one-layer docker save tar: /bin/busybox and a link per applet, root's passwd, /tmp."""
    busybox = shutil.which("busybox") or BUSYBOX
    root = work / "base-root"
    (root / "bin").mkdir(parents=True)
    shutil.copy(busybox, root / "bin" / "busybox")
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if applet != "busybox":
            os.symlink("busybox", root / "bin" / applet)
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    (root / "root").mkdir(mode=0o700)
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)
    out = work / "base.tar"
    config = ImageConfig(env=("PATH=/usr/local/bin:/usr/bin:/bin",), workdir="/", user="root")
    write_docker_archive(out, [layer_from_dir(root, work / "base-layer.tar")], config, "rollout/busybox-full:1")
    return out
