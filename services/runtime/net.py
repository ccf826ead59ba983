"""Loopback ports for the services a process starts (tests, benches, the demo).

A port is handed out once until its claim expires, across every process on the machine: picks are
drawn below the ephemeral range (32768+, where the kernel takes ports for outgoing connections and
``bind(0)``) and recorded in a registry file under an exclusive lock. Two races are gone with it:
a port read from ``bind(0)`` and taken by an outgoing connection before its service bound it, and
two processes drawing the same port at random.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

LOW, HIGH = 20_000, 32_000  # below the ephemeral range
CLAIM_S = 180.0  # a claimed port's service has bound it (or given up) by then
REGISTRY = Path(tempfile.gettempdir()) / "rollout-port-claims.json"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago and that no other caller is handed for ``CLAIM_S``."""
    return free_port_range(1, host)


def free_port_range(count: int, host: str = "127.0.0.1", attempts: int = 400) -> int:
    """A base port such that ``base .. base + count - 1`` were all free a moment ago, claimed as
    :func:`free_port` claims one. Sockets in TIME_WAIT do not count as taken (servers bind with
    SO_REUSEADDR)."""
    rng = random.Random()
    with _registry() as claims:
        now = time.time()
        for port in [p for p, until in claims.items() if until < now]:
            del claims[port]
        for _ in range(attempts):
            base = rng.randrange(LOW, HIGH - count)
            ports = range(base, base + count)
            if not any(str(p) in claims for p in ports) and all(_bindable(host, p) for p in ports):
                claims.update({str(p): now + CLAIM_S for p in ports})
                return base
    raise RuntimeError(f"no {count} consecutive free ports on {host}")


@contextlib.contextmanager
def _registry() -> Iterator[dict[str, float]]:
    """The claims (port -> expiry), read and written back under an exclusive lock; an empty
    registry where the file cannot be used (each pick is then checked by binding only)."""
    try:
        fd = os.open(REGISTRY, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        yield {}
        return
    with os.fdopen(fd, "r+") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            claims = json.loads(file.read() or "{}")
        except ValueError:
            claims = {}
        yield claims
        file.seek(0)
        file.truncate()
        file.write(json.dumps(claims))
        file.flush()  # the lock is released on close, after the write


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True
