"""The processes of a fleet benchmark (scripted engines, proxy, broker, API, workers) and the CPU
time they use, read from /proc per service's process tree (the broker's holds its agent zygote, which
runs in a session of its own, with the sandboxes and exec agents it forks and reaps)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from services.benchmarks.procstat import trees_total_cpu_s
from services.runtime.net import free_port
from services.runtime.processes import stop_group, wait_healthy


@dataclass
class Service:
    role: str  # "engine", "proxy", "broker", "api", "worker"
    url: str
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        stop_group(self.proc, timeout_s=15)


@dataclass
class Stack:
    logs: Path
    env: dict[str, str]
    services: list[Service] = field(default_factory=list)

    def start(self, role: str, args: list[str], *, health: str = "/healthz", timeout_s: float = 60.0) -> Service:
        port = free_port()
        argv = [sys.executable, "-m", "services.cli", *(a.replace("{port}", str(port)) for a in args)]
        log = (self.logs / f"{role}-{port}.log").open("wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        log.close()
        service = Service(role, f"http://127.0.0.1:{port}", proc)
        self.services.append(service)
        wait_healthy(proc, service.url + health, timeout_s, role, lambda: f"; see {self.logs}")
        return service

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds used so far by each role: the live processes of its services' trees, each with
        the children it reaped."""
        roots = {s.proc.pid: s.role for s in self.services if s.proc.poll() is None}
        return {**dict.fromkeys({s.role for s in self.services}, 0.0), **trees_total_cpu_s(roots)}
