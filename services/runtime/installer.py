"""Installing Python packages into another virtual environment (an agent bundle's, a host harness's):
with uv's pip interface where uv is installed (beside this interpreter or on ``PATH``), else with that
environment's own pip. uv resolves, downloads and byte-compiles in parallel: mini-swe-agent's
environment took 43 s of one core with pip here and 24 s of CPU (14 s of wall) with uv, both with
cold caches.

uv reads none of pip's configuration, so pip's (its files and ``PIP_*`` variables: constraints,
find-links, indexes, certificate) is handed to it, and it weighs every index as pip does
(``--index-strategy unsafe-best-match``: the best version wherever it is, not the first index that
has the project). Run as a module (``python -m services.runtime.installer PYTHON``, standard library
only: ``scripts/setup.sh`` runs it before anything is installed), it prints uv's options for
``PYTHON``'s environment, one per line, and ``--env=NAME=VALUE`` for each variable to export."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive(target: Path) -> Iterator[None]:
    """One installer of ``target`` at a time across processes: an flock on ``.NAME.lock`` beside it
    (made where missing and kept: removing it would let a third process lock a new file while the
    second holds the old one). A second installer waits, then finds the first's work."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a") as lock:  # closing it releases the lock
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def uv_binary() -> str | None:
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which("uv")


def pip_config(python: str) -> list[tuple[str, str]]:
    """``pip config list`` of ``python``'s pip (every file and ``PIP_*`` variable), as (key, value)
    pairs with the section dropped; a value that lists several (``find-links = A B``) gives one
    pair each. Nothing where that pip is missing."""
    try:
        done = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    pairs = []
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        key, _, value = line.partition("=")
        pairs += [(key.rpartition(".")[2], item) for item in value.strip("'\"").split()]
    return pairs


def uv_options(python: str, config: list[tuple[str, str]]) -> tuple[list[str], dict[str, str]]:
    """uv's options that install into ``python``'s environment as pip configured by ``config``
    would, and the environment variables they need (the certificate)."""
    options = ["--python", python, "--index-strategy", "unsafe-best-match"]
    env = {}
    flags = {"constraint": "--constraint", "find-links": "--find-links", "extra-index-url": "--extra-index-url",
             "index-url": "--index-url"}  # fmt: skip
    for key, value in config:
        if key in flags:
            options += [flags[key], value]
        elif key == "cert":
            env["SSL_CERT_FILE"] = value
    return options, env


def install_command(python: str) -> tuple[list[str], dict[str, str]]:
    """The command (packages to be appended) that installs into ``python``'s environment, byte-compiled,
    and the environment variables to add for it."""
    uv = uv_binary()
    if uv is None:
        return [python, "-m", "pip", "install", "--disable-pip-version-check", "--quiet"], {}
    options, env = uv_options(python, pip_config(python))
    return [uv, "pip", "install", "--quiet", "--compile-bytecode", *options], env


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m services.runtime.installer PYTHON (prints uv's options for its environment)")
    opts, variables = uv_options(sys.argv[1], pip_config(sys.argv[1]))
    print("\n".join(opts + [f"--env={k}={v}" for k, v in variables.items()]))  # --env=NAME=VALUE: to export
