"""Processes the broker benchmark starts: the broker itself (killable with SIGKILL and restartable
under the same instance name) and, for the e2b backend, the fake E2B service."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from services.benchmarks.cpuacct import CpuGroup
from services.runtime.net import free_port
from services.runtime.processes import wait_healthy


@dataclass
class Proc:
    argv: list[str]
    env: dict[str, str]
    port: int
    log: Path
    health: str = "/healthz"
    proc: subprocess.Popen[bytes] | None = None
    cpu_group: CpuGroup | None = None  # counts the process's CPU and its descendants' (cpuacct.py)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # fmt: skip
        if self.cpu_group is not None:  # before it starts anything: a Python service imports for a while first
            self.cpu_group.join(self.proc.pid)
        wait_healthy(self.proc, self.url + self.health, timeout_s, str(self.argv[:4]), lambda: f"; see {self.log}")

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
