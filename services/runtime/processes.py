"""Start any service as a real subprocess on a free port and wait for its ``/healthz``.

Used by ``rollout up`` (the whole fleet on one machine) and by the tests."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from services.runtime import forkserver
from services.runtime.logs import STACKS_SIGNAL
from services.runtime.net import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout (children import its code)
PR_SET_PDEATHSIG = 1
STACKS_WAIT_S = 0.5


class Process(Protocol):
    """A service's process: a ``subprocess.Popen`` or a :class:`~services.runtime.forkserver.ForkedProcess`."""

    pid: int
    returncode: int | Any

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...


@dataclass
class ServiceProcess:
    """A service subprocess. ``url`` is its base URL; ``stop()`` ends it (SIGTERM, then SIGKILL)."""

    argv: list[str]
    port: int
    proc: Process
    log_path: Path
    host: str = "127.0.0.1"
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (the service and any children it started)."""
        if self.alive():
            os.killpg(self.proc.pid, sig)
        self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 10.0) -> None:
        stop_group(self.proc, timeout_s)


def stop_group(proc: Process, timeout_s: float = 10.0) -> None:
    """End a child started in its own session and everything it spawned: SIGTERM, then SIGKILL.

    One still running ``timeout_s`` after its SIGTERM is first sent ``STACKS_SIGNAL``: a service
    (``logs.configure_logging``) then writes where each of its threads was stuck to its log, which
    a SIGKILL alone leaves ending at "Waiting for application shutdown" with nothing to say why."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, STACKS_SIGNAL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STACKS_WAIT_S)  # faulthandler writes them from its signal handler at once
        with contextlib.suppress(ProcessLookupError):  # a child without the handler died of the signal
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies, ``kill -9`` included
    (Linux ``PR_SET_PDEATHSIG``); if the parent is already gone, send it now. Without this, the
    workers of a killed parent keep serving its port beside the parent's replacement."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def python_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child Python process running this checkout's code."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("ROLLOUT_LOG_LEVEL", "INFO")
    env.update(extra or {})
    return env


def start_service(
    args: Sequence[str],
    *,
    log_dir: Path,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    health_path: str = "/healthz",
    timeout_s: float = 30.0,
    name: str | None = None,
) -> ServiceProcess:
    """Run ``python <args>`` with ``{port}`` in ``args`` replaced, wait until ``health_path`` answers 200.

    The child gets its own process group so that ``stop()`` also ends what it spawned.
    """
    service = launch_service(args, log_dir=log_dir, port=port, env=env, name=name)
    wait_started(service, health_path, timeout_s)
    return service


def launch_service(
    args: Sequence[str],
    *,
    log_dir: Path,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    name: str | None = None,
) -> ServiceProcess:
    """``start_service`` without the wait: the process runs, its port is chosen (so its URL can be
    handed to the next services), and ``wait_started`` waits for it. Several services then start
    at once instead of one after another."""
    port = port or free_port()
    argv = [sys.executable, *(a.replace("{port}", str(port)) for a in args)]
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name or 'service'}-{port}.log"
    child_env = python_env(env)
    server = child_env.pop(forkserver.ENV, None)  # this process's launches only, not its services'
    with log_path.open("wb") as log_file:
        if server and forkserver.forkable(argv, child_env, server):
            proc: Process = forkserver.spawn(server, argv, child_env, REPO_ROOT, log_path)
        else:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=child_env,
                cwd=REPO_ROOT, start_new_session=True,
            )  # fmt: skip
    return ServiceProcess(argv=argv, port=port, proc=proc, log_path=log_path)


def wait_started(service: ServiceProcess, health_path: str = "/healthz", timeout_s: float = 30.0) -> None:
    """Wait until a launched service's ``health_path`` answers 200 (stopped again if it never does)."""
    try:
        wait_healthy(
            service.proc, service.url + health_path, timeout_s, str(service.argv),
            lambda: ":\n" + service.log()[-3000:],
        )  # fmt: skip
    except TimeoutError:
        service.stop()
        raise


def wait_healthy(proc: Process, url: str, timeout_s: float, name: str, detail: Callable[[], str] = str) -> None:
    """Poll ``url`` until it answers 200: RuntimeError if ``proc`` exits first, TimeoutError after
    ``timeout_s``; ``detail()`` (e.g. the log's tail) ends either message."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}{detail()}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url).status_code == 200:
                    return
            time.sleep(0.05)
    raise TimeoutError(f"{name} did not answer {url} within {timeout_s}s{detail()}")
