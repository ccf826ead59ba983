"""Python harnesses from PyPI in a virtual environment of their own, installed once per machine
under ``~/.cache/rollout-harnesses/<package>-<version>`` (aider pins exact versions of dozens of
packages, so it never shares the project's environment), with uv where it is installed
(``services/runtime/installer.py``). Where the interpreter or the registry
is missing, or the install takes over ``install_s``, :class:`HarnessUnavailable` says why and the
half-made environment is removed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from services.benchmarks.npm_harness import HarnessUnavailable
from services.runtime.installer import exclusive, install_command

INSTALL_S = 240


def venv_binary(package: str, version: str, binary: str, python: str = sys.executable,
                install_s: float = INSTALL_S) -> Path:  # fmt: skip
    prefix = Path.home() / ".cache" / "rollout-harnesses" / f"{package}-{version}"
    path = prefix / "bin" / binary
    with exclusive(prefix):  # another process installing it: wait, then use it
        if not path.exists():
            _make(prefix, f"{package}=={version}", binary, python, install_s)
    return path


def _make(prefix: Path, requirement: str, binary: str, python: str, install_s: float) -> None:
    shutil.rmtree(prefix, ignore_errors=True)

    def step(argv: list[str], env: dict[str, str]) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=install_s, env={**os.environ, **env})
        if done.returncode != 0:
            raise HarnessUnavailable(f"could not install {requirement}: {done.stderr.strip()[-300:]}")

    try:
        step([python, "-m", "venv", str(prefix)], {})
        command, env = install_command(str(prefix / "bin" / "python"))  # that environment's pip configuration
        step([*command, requirement], env)
    except subprocess.TimeoutExpired:
        shutil.rmtree(prefix, ignore_errors=True)
        raise HarnessUnavailable(f"could not install {requirement} within {install_s:g} s") from None
    except HarnessUnavailable:
        shutil.rmtree(prefix, ignore_errors=True)
        raise
    if not (prefix / "bin" / binary).exists():
        shutil.rmtree(prefix, ignore_errors=True)
        raise HarnessUnavailable(f"{requirement} installed no {binary}")
