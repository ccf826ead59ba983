"""Starting real engine and proxy processes for the proxy tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

from services.runtime.net import free_port_range
from tests.support.processes import ServiceProcess, start_service

# The proxy tests are about routing and weights, not tokens: development mode (no token = admin).
# tests/llm_proxy/test_auth.py starts proxies with real tokens.
DEV_ENV = {"ROLLOUT_PROXY_ALLOW_ANONYMOUS": "true"}
FAST_ENGINE = ("--decode-step-s", "0.005", "--output-tokens", "8", "--weight-load-s", "0.2")


def start_engines(log_dir: Path, count: int, *extra: str, name: str = "engine") -> tuple[ServiceProcess, list[str]]:
    """``count`` sim engines from one process on consecutive free ports; returns the process and the URLs."""
    argv = ["-m", "services.cli", "engine", "--port", "{port}", "--count", str(count), *FAST_ENGINE, *extra]
    for attempt in range(3):  # another process may take one of the ports between the check and the bind
        try:
            svc = start_service(argv, log_dir=log_dir, name=name, port=free_port_range(count))
            return svc, [f"http://127.0.0.1:{svc.port + i}" for i in range(count)]
        except RuntimeError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def start_proxy(
    log_dir: Path,
    redis_url: str,
    engines: Sequence[str],
    *extra: str,
    timeout_s: float = 30.0,
    env: Mapping[str, str] | None = None,
) -> ServiceProcess:
    return start_service(
        ["-m", "services.cli", "proxy", "--port", "{port}", "--workers", "2", "--engines", ",".join(engines),
         "--health-interval-s", "0.2", "--eject-after-failures", "2", *extra],
        log_dir=log_dir, name="proxy", env={"ROLLOUT_REDIS_URL": redis_url, **DEV_ENV, **(env or {})},
        timeout_s=timeout_s,
    )  # fmt: skip


def wait_until(check: Callable[[], bool], timeout_s: float = 15.0, what: str = "condition") -> None:
    """Poll ``check`` until it holds (tests assert outcomes, never durations)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def engine_states(proxy_url: str, pool: str = "default") -> dict[str, dict[str, object]]:
    """``/admin/status`` of one proxy process, keyed by engine id (a new connection each time)."""
    doc = httpx.get(proxy_url + "/admin/status", timeout=10).json()
    return {e["engine_id"]: e for e in doc["pools"][pool]["engines"]}


def generate(proxy_url: str, body: Mapping[str, object], headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(proxy_url + "/generate", json=body, headers=headers, timeout=60)
