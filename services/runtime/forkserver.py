"""Service processes forked from an interpreter that has imported their libraries already.

Most of a service's start is imports: 0.7-0.9 s of CPU on this project's reference machine
(fastapi, aiohttp, redis, uvicorn, pydantic, httpx) of the 1.1-1.4 s it takes to answer its first
health check. A test suite starts hundreds. When ``ROLLOUT_FORKSERVER`` names this server's socket,
:func:`services.runtime.processes.launch_service` asks it instead of exec'ing a new interpreter: it
forks, and the child becomes what ``python -m <module> <args>`` would be (a session of its own,
stdout and stderr to the service's log, stdin from /dev/null, the request's environment and working
directory, no other descriptor open, the signal dispositions and mask of a fresh interpreter), then
runs the module as ``__main__`` and exits as the interpreter would (threads joined, ``atexit``
handlers run, streams flushed; the exit code of ``SystemExit``, 1 after an uncaught exception).

Only third-party libraries are imported ahead (:data:`PRELOAD`), never the platform's own modules, and
only a request whose ``PYTHON*`` variables equal the server's is forked (anything else is exec'd as
before): what an interpreter reads from its environment at start is the same either way. The caller
holds a :class:`ForkedProcess`, which answers as ``subprocess.Popen`` does (``pid``, ``poll``,
``wait``, ``returncode``, signals) through a pidfd and the exit status that the server, its parent,
collects. Used by the test suite (``tests/conftest.py``); ``rollout up`` and the deployments exec.

Protocol: one JSON line per connection, one JSON line back. ``{"op": "spawn", "argv", "env", "cwd",
"log"}`` -> ``{"pid"}`` or ``{"error"}``; ``{"op": "wait", "pid"}`` -> ``{"status"}`` once the child
has ended (``Popen.returncode``'s convention: ``-N`` for a signal).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ENV = "ROLLOUT_FORKSERVER"  # the socket's path, where a server runs for this process's launches
PRELOAD = (
    "fastapi", "fastapi.openapi.models", "starlette.applications", "uvicorn", "uvicorn.main",
    "uvicorn.protocols.http.httptools_impl", "aiohttp", "aiohttp.web", "redis", "redis.asyncio", "httpx",
    "pydantic", "pydantic_settings", "prometheus_client", "jinja2", "jinja2.sandbox", "tokenizers",
)  # fmt: skip


# what an interpreter, its dynamic loader or a preloaded library reads from the environment once, at
# start or at import (the locale, SSL's default certificates in aiohttp's contexts): a request must
# have the server's values of these to be forked
SAME_PREFIXES = ("PYTHON", "LC_", "AIOHTTP_", "LD_")
SAME_NAMES = ("LANG", "LANGUAGE", "SSL_CERT_FILE", "SSL_CERT_DIR", "TZ")


ARGV_ROOM = 8192  # bytes of a child's command line the server's argv holds (a longer one is cut)


def _read_once(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(SAME_PREFIXES) or k in SAME_NAMES}


def forkable(argv: Sequence[str], env: Mapping[str, str], socket_path: str) -> bool:
    """Whether ``argv`` (``python -m module ...``) in ``env`` may be forked by the server on
    ``socket_path``: the same interpreter, and the same values of what it read from its environment."""
    try:
        server_env = json.loads(Path(f"{socket_path}.env").read_text())
    except (OSError, ValueError):
        return False
    same = _read_once(env) == server_env and hasattr(os, "pidfd_open")  # Linux 5.3 and later
    return len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and same


class ForkedProcess:
    """A forked service, as the code that started it sees a ``subprocess.Popen``."""

    def __init__(self, socket_path: str, pid: int, args: list[str]) -> None:
        self.socket_path, self.pid, self.args = socket_path, pid, args
        self.returncode: int | None = None
        self._lock = threading.Lock()
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # ended (and collected by the server) already
            self._pidfd = None

    def poll(self) -> int | None:
        if self.returncode is None and self._ended(0):
            self._collect()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not self._ended(timeout):
                assert timeout is not None
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._collect()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None and self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _ended(self, timeout: float | None) -> bool:
        fd = self._pidfd
        if fd is None:
            return True
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000))))

    def _collect(self) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            self.returncode = int(request(self.socket_path, {"op": "wait", "pid": self.pid})["status"])
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None

    def __del__(self) -> None:
        if getattr(self, "_pidfd", None) is not None:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)  # type: ignore[arg-type]


def request(socket_path: str, message: dict[str, Any]) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(socket_path)
        sock.sendall(json.dumps(message).encode() + b"\n")
        reply: dict[str, Any] = json.loads(sock.makefile("rb").readline() or b"{}")
    if "error" in reply or not reply:
        raise RuntimeError(f"fork server {socket_path}: {reply.get('error', 'no reply')}")
    return reply


def spawn(socket_path: str, argv: list[str], env: Mapping[str, str], cwd: Path, log: Path) -> ForkedProcess:
    reply = request(socket_path, {"op": "spawn", "argv": argv, "env": dict(env), "cwd": str(cwd), "log": str(log)})
    return ForkedProcess(socket_path, int(reply["pid"]), argv)


def start(socket_path: Path, env: Mapping[str, str], cwd: Path, timeout_s: float = 60.0) -> subprocess.Popen[bytes]:
    """Start a server on ``socket_path`` (this process's child, which it outlives by nothing: it ends
    with its parent) and wait until it accepts requests. What of ``env`` a request must share is
    written beside the socket (``<socket>.env``), for every process that launches through it."""
    Path(f"{socket_path}.env").write_text(json.dumps(_read_once(env)))
    # the padding: room in the server's own argv for each child's, which it writes there (/proc/PID/cmdline)
    argv = [sys.executable, "-m", __name__, str(socket_path), " " * ARGV_ROOM]
    proc = subprocess.Popen(argv, env=dict(env), cwd=cwd)
    deadline = time.monotonic() + timeout_s
    while not socket_path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the fork server did not start (exit {proc.poll()})")
        time.sleep(0.02)
    return proc


# -- the server ---------------------------------------------------------------------------------


class _Server:
    def __init__(self, path: str) -> None:
        self.statuses: dict[int, int] = {}
        self.waiting: dict[int, list[socket.socket]] = {}
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd does the work
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path + ".tmp")
        os.rename(path + ".tmp", path)  # the caller waits for the path: it appears ready
        self.listener.listen(64)

    def serve(self) -> None:
        poller = select.poll()
        for fd in (self.listener.fileno(), self.wake_r):
            poller.register(fd, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self.wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 4096)
                self.reap()
            if self.listener.fileno() in ready:
                conn, _ = self.listener.accept()
                self.handle(conn)

    def handle(self, conn: socket.socket) -> None:
        try:
            message = json.loads(conn.makefile("rb").readline())
            if message["op"] == "spawn":
                self.reply(conn, {"pid": self.fork(message, conn)})
            elif (pid := int(message["pid"])) in self.statuses:
                self.reply(conn, {"status": self.statuses[pid]})
            else:
                self.waiting.setdefault(pid, []).append(conn)  # answered when it ends
                self.reap()
        except Exception as exc:  # a bad request: said to the caller, the server serves on
            self.reply(conn, {"error": f"{type(exc).__name__}: {exc}"})

    def reply(self, conn: socket.socket, body: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(body).encode() + b"\n")
        conn.close()

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.statuses[pid] = os.waitstatus_to_exitcode(status)
            for conn in self.waiting.pop(pid, []):
                self.reply(conn, {"status": self.statuses[pid]})

    def fork(self, message: dict[str, Any], conn: socket.socket) -> int:
        argv, log = list(message["argv"]), os.open(message["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            os.close(log)
            os.close(null)
            return pid
        try:  # the child: nothing here may return to the server's loop
            for sock in (self.listener, conn, *(c for conns in self.waiting.values() for c in conns)):
                sock.detach()  # closed below by number: no socket object may close a number the service reuses
            _become(argv, dict(message["env"]), message["cwd"], null, log)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        with contextlib.suppress(Exception):
            _set_cmdline(argv)
        _run(argv[2], argv[3:])
        raise AssertionError("unreachable")


def _become(argv: list[str], env: dict[str, str], cwd: str, stdin: int, log: int) -> None:
    """As the forked child: what ``Popen(argv, stdin=DEVNULL, stdout=log, stderr=STDOUT, env=env,
    cwd=cwd, start_new_session=True)`` of a fresh interpreter would be before it runs its module."""
    os.setsid()
    for target, fd in ((0, stdin), (1, log), (2, log)):
        os.dup2(fd, target)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the listener, connections, the wakeup pipe, the log
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # found again from TMPDIR at its next use, as a new interpreter would


def _set_cmdline(argv: list[str]) -> None:
    """Write ``argv`` over this process's own, so that ``/proc/self/cmdline`` (what ``ps`` and tools
    that look for a service by its command line read) names the service; the rest of the server's
    argv area reads as NULs after it (moving its end takes CAP_SYS_RESOURCE)."""
    fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48 and 49 of proc(5))
    data = (b"\0".join(a.encode() for a in argv) + b"\0")[: end - start - 1] + b"\0"
    ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)


def _run(module: str, args: list[str]) -> None:
    """``python -m module args``, then the interpreter's exit: threads joined, ``atexit`` handlers, streams flushed."""
    sys.argv = [module, *args]
    sys.orig_argv = [sys.executable, "-m", module, *args]
    sys.path[0] = os.getcwd()  # what ``-m`` puts first
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # as the interpreter does at its end
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(code)


def main() -> None:
    path = sys.argv[1]
    from services.runtime.gc_tuning import freeze_heap
    from services.runtime.processes import die_with_parent

    die_with_parent(os.getppid(), signal.SIGKILL)  # the caller's launches end with it; the services do not
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    assert threading.active_count() == 1, "a preloaded library started a thread: forking would copy it half-done"
    freeze_heap()  # a service's start-up collection (tune_gc) walked and copied the preloaded heap: 50-80 ms of CPU
    _Server(path).serve()


if __name__ == "__main__":
    main()
