"""Loopback ports."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_port_range(count: int, host: str = "127.0.0.1", attempts: int = 50) -> int:
    """A base port such that ``base .. base + count - 1`` were all free a moment ago."""
    for _ in range(attempts):
        base = free_port(host)
        if base + count < 65_000 and all(_bindable(host, base + i) for i in range(1, count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports on {host}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True
