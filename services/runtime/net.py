"""Loopback ports."""

from __future__ import annotations

import random
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_port_range(count: int, host: str = "127.0.0.1", attempts: int = 200) -> int:
    """A base port such that ``base .. base + count - 1`` were all free a moment ago.

    Bases are drawn below the usual ephemeral range (32768+), where outgoing connections do not
    take ports at random; sockets in TIME_WAIT do not count as taken (servers bind with
    SO_REUSEADDR).
    """
    rng = random.Random()
    for _ in range(attempts):
        base = rng.randrange(20_000, 32_000 - count)
        if all(_bindable(host, base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports on {host}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True
