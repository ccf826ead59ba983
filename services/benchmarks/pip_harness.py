"""Python harnesses from PyPI in a virtual environment of their own, installed once per machine
under ``~/.cache/rollout-harnesses/<package>-<version>`` (aider pins exact versions of dozens of
packages, so it never shares the project's environment). Where the interpreter or the registry
is missing, or the install takes over ``install_s``, :class:`HarnessUnavailable` says why and the
half-made environment is removed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from services.benchmarks.npm_harness import HarnessUnavailable

INSTALL_S = 240


def venv_binary(package: str, version: str, binary: str, python: str = sys.executable,
                install_s: float = INSTALL_S) -> Path:  # fmt: skip
    prefix = Path.home() / ".cache" / "rollout-harnesses" / f"{package}-{version}"
    path = prefix / "bin" / binary
    if path.exists():
        return path
    shutil.rmtree(prefix, ignore_errors=True)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    steps = [[python, "-m", "venv", str(prefix)],
             [str(prefix / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
              f"{package}=={version}"]]  # fmt: skip
    try:
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=install_s)
            if done.returncode != 0:
                raise HarnessUnavailable(f"could not install {package}=={version}: {done.stderr.strip()[-300:]}")
    except subprocess.TimeoutExpired:
        shutil.rmtree(prefix, ignore_errors=True)
        raise HarnessUnavailable(f"pip could not install {package}=={version} within {install_s:g} s") from None
    except HarnessUnavailable:
        shutil.rmtree(prefix, ignore_errors=True)
        raise
    if not path.exists():
        shutil.rmtree(prefix, ignore_errors=True)
        raise HarnessUnavailable(f"{package}=={version} installed no {binary}")
    return path
