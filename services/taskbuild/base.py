"""The base root filesystem of the shipped tasks: Debian 12 (minbase) with python3, git and patch,
made by ``mmdebstrap`` from Debian's packages (no registry needed) and cached."""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from pathlib import Path

log = logging.getLogger(__name__)

PACKAGES = ("python3", "git", "patch", "ca-certificates")
SUITE = "bookworm"


def base_name() -> str:
    return f"base-{SUITE}-{'-'.join(p.replace('-', '') for p in PACKAGES)}.tar"


def ensure_base(cache: Path) -> Path:
    """The cached base tar (a plain root filesystem tar: one image layer), made if missing."""
    target = cache / base_name()
    if target.exists():
        return target
    if shutil.which("mmdebstrap") is None:
        raise RuntimeError("mmdebstrap is needed to build the base image (apt-get install mmdebstrap), "
                           "or pass --base with a root filesystem tar")  # fmt: skip
    staging = target.with_suffix(".tmp.tar")
    hooks = ['--customize-hook=rm -f "$1"/etc/resolv.conf "$1"/etc/hostname']  # the build host's, not the image's
    started = time.monotonic()
    subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase", f"--include={','.join(PACKAGES)}", *hooks,
                    SUITE, str(staging)], check=True)  # fmt: skip
    staging.rename(target)
    log.info("built the base image %s in %.0f s", target, time.monotonic() - started)
    return target
