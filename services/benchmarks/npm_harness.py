"""Real CLI harnesses from npm, installed once per machine under
``~/.cache/rollout-harnesses/<name>-<version>``, for ``rollout bench agents`` and the gateway's
dialect tests. Where npm is missing or cannot install the package within ``INSTALL_S`` (no
registry, a slow link) :class:`HarnessUnavailable` says why: nothing waits on a registry longer."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from services.runtime.installer import exclusive

INSTALL_S = 75  # the tests allow 240 s: this, the fleet's start and the harness's run (90 s at most)


class HarnessUnavailable(Exception):
    """The harness cannot run here; the message says why."""


def npm_binary(package: str, version: str, binary: str, install_s: float = INSTALL_S) -> Path:
    if shutil.which("npm") is None:
        raise HarnessUnavailable(f"npm is not installed: {package} is installed from npm")
    prefix = Path.home() / ".cache" / "rollout-harnesses" / f"{package.rsplit('/', 1)[-1]}-{version}"
    path = prefix / "node_modules" / ".bin" / binary
    with exclusive(prefix):  # another process installing it: wait, then use it
        if path.exists():
            return path
        prefix.mkdir(parents=True, exist_ok=True)
        argv = ["npm", "install", "--no-audit", "--no-fund", "--fetch-retries=1", "--fetch-timeout=20000",
                "--prefix", str(prefix), f"{package}@{version}"]  # fmt: skip
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=install_s)
        except subprocess.TimeoutExpired:
            raise HarnessUnavailable(f"npm could not install {package}@{version} within {install_s:g} s") from None
        if done.returncode != 0 or not path.exists():
            raise HarnessUnavailable(f"npm could not install {package}@{version}: {done.stderr.strip()[-300:]}")
    return path
