"""Processes the broker benchmark starts: the broker itself (killable with SIGKILL and restartable
under the same instance name) and, for the e2b backend, the fake E2B service."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from services.runtime.net import free_port


@dataclass
class Proc:
    argv: list[str]
    env: dict[str, str]
    port: int
    log: Path
    health: str = "/healthz"
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[:4]} exited {self.proc.returncode}; see {self.log}")
            try:
                if httpx.get(self.url + self.health, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.argv[:4]} not healthy within {timeout_s}s; see {self.log}")

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill9()


def python_proc(module_args: Sequence[str], env: dict[str, str], log: Path, health: str = "/healthz") -> Proc:
    port = free_port()
    argv = [sys.executable, *(a.replace("{port}", str(port)) for a in module_args)]
    root = str(Path(__file__).resolve().parents[2])
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
                "ROLLOUT_LOG_LEVEL": "WARNING", **env}  # fmt: skip
    return Proc(argv, full_env, port, log, health)
