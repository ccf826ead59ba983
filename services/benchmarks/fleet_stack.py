"""The processes of a fleet benchmark (scripted engines, proxy, broker, API, workers) and the CPU
time they use, read from /proc per process session (each service runs in its own session)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from services.runtime.net import free_port
from services.runtime.processes import stop_group

_TICKS = os.sysconf("SC_CLK_TCK")


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
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{role} exited with {proc.returncode}; see {self.logs}")
            try:
                if httpx.get(service.url + health, timeout=2.0).status_code == 200:
                    return service
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{role} did not become healthy; see {self.logs}")

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds used so far by each role: live processes of its sessions plus reaped children."""
        sessions = {s.proc.pid: s.role for s in self.services if s.proc.poll() is None}
        totals = dict.fromkeys({s.role for s in self.services}, 0.0)
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            role = sessions.get(int(fields[3]))  # field 6 of stat: the session id
            if role is not None:  # utime, stime, cutime, cstime: fields 14-17
                totals[role] += sum(int(v) for v in fields[11:15]) / _TICKS
        return totals
