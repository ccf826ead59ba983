"""Real CLI harnesses from npm for the gateway's dialect tests, installed once per machine under
``~/.cache/rollout-harnesses/<name>-<version>``. A test that needs one is skipped, saying why,
where npm is missing or cannot install the package within ``INSTALL_S`` (no registry, a slow link):
the suite never waits on a registry for longer than that. The tests allow 240 s each."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

INSTALL_S = 75  # the tests allow 240 s: this, the fleet's start and the harness's run (90 s at most)


def npm_binary(package: str, version: str, binary: str) -> Path:
    if shutil.which("npm") is None:
        pytest.skip(f"npm is not installed: {package} is installed from npm")
    prefix = Path.home() / ".cache" / "rollout-harnesses" / f"{package.rsplit('/', 1)[-1]}-{version}"
    path = prefix / "node_modules" / ".bin" / binary
    if path.exists():
        return path
    prefix.mkdir(parents=True, exist_ok=True)
    argv = ["npm", "install", "--no-audit", "--no-fund", "--fetch-retries=1", "--fetch-timeout=20000",
            "--prefix", str(prefix), f"{package}@{version}"]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_S)
    except subprocess.TimeoutExpired:
        pytest.skip(f"npm could not install {package}@{version} within {INSTALL_S} s")
    if done.returncode != 0 or not path.exists():
        pytest.skip(f"npm could not install {package}@{version}: {done.stderr.strip()[-300:]}")
    return path
