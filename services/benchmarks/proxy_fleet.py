"""Processes of ``rollout bench proxy``: simulated engines, our proxy, the Rust sglang-router.

Each runs as a subprocess in its own session; :class:`Launched` stops the whole group. CPU time
is read from ``/proc`` for a process and all its descendants.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from services.benchmarks.procstat import tree_cpu_s
from services.runtime.auth import new_secret
from services.runtime.net import free_port, free_port_range
from services.runtime.processes import stop_group, wait_healthy

BENCH_ADMIN = new_secret()  # the proxy runs with authentication on, as deployed
ADMIN_HEADERS = {"Authorization": f"Bearer {BENCH_ADMIN}"}


@dataclass
class Launched:
    name: str
    proc: subprocess.Popen[bytes]
    url: str

    def stop(self) -> None:
        stop_group(self.proc, timeout_s=15)

    def cpu_s(self) -> float:
        return tree_cpu_s(self.proc.pid)


def launch(
    name: str,
    argv: Sequence[str],
    url: str,
    health: str,
    log_dir: Path,
    timeout_s: float = 120,
    env: dict[str, str] | None = None,
) -> Launched:
    """Start ``argv`` and wait until ``url + health`` answers 200."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})}
        )
    launched = Launched(name, proc, url)
    try:
        wait_healthy(proc, url + health, timeout_s, name, lambda: f"; see {log_dir / (name + '.log')}")
    except TimeoutError:
        launched.stop()
        raise
    return launched


def start_engines(
    k: int, processes: int, engine_args: Sequence[str], log_dir: Path
) -> tuple[list[Launched], list[str]]:
    """``k`` sim engines in ``processes`` processes on consecutive ports."""
    base = free_port_range(k)
    launched, urls = [], []
    per = -(-k // processes)
    for p, first in enumerate(range(0, k, per)):
        count = min(per, k - first)
        argv = [sys.executable, "-m", "services.cli", "engine", "--port", str(base + first), "--count", str(count),
                *engine_args]  # fmt: skip
        try:
            launched.append(launch(f"engines-{p}", argv, f"http://127.0.0.1:{base + first}", "/healthz", log_dir))
        except (RuntimeError, TimeoutError):
            for item in launched:
                item.stop()
            raise
        urls += [f"http://127.0.0.1:{base + first + i}" for i in range(count)]
    for url in urls:  # every engine of a process is up once the first is, but check
        httpx.get(url + "/health", timeout=10).raise_for_status()
    return launched, urls


def start_proxy(engine_urls: Sequence[str], workers: int, log_dir: Path, *extra: str) -> Launched:
    """Our proxy with authentication on (as deployed); Redis from ``ROLLOUT_REDIS_URL`` or embedded."""
    port = free_port()
    argv = [sys.executable, "-m", "services.cli", "proxy", "--port", str(port), "--workers", str(workers),
            "--engines", ",".join(engine_urls), *extra]  # fmt: skip
    env_url = f"http://127.0.0.1:{port}"
    proxy = launch("proxy", argv, env_url, "/healthz", log_dir, env={"ROLLOUT_PROXY_ADMIN_TOKEN": BENCH_ADMIN})
    deadline = time.monotonic() + 30  # every engine routable from the process we ask
    while time.monotonic() < deadline:
        doc = httpx.get(env_url + "/admin/status", timeout=10, headers=ADMIN_HEADERS).json()
        engines = doc["pools"]["default"]["engines"]
        if len(engines) == len(engine_urls) and not any(e["ejected"] for e in engines):
            break
        time.sleep(0.2)
    return proxy


def start_router(engine_urls: Sequence[str], log_dir: Path) -> Launched:
    port = free_port()
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *engine_urls, "--policy", "round_robin", "--prometheus-port", str(free_port()),
            "--worker-startup-check-interval", "1", "--log-level", "warn"]  # fmt: skip
    return launch("sglang-router", argv, f"http://127.0.0.1:{port}", "/health", log_dir, timeout_s=180)


@contextlib.contextmanager
def stopping(launched: list[Launched]) -> Iterator[list[Launched]]:
    try:
        yield launched
    finally:
        for item in reversed(launched):
            item.stop()
