"""Loopback port helpers."""

from __future__ import annotations

import socket
from pathlib import Path

from services.runtime.net import free_port, free_port_range


def test_free_port_range_gives_consecutive_bindable_ports() -> None:
    base = free_port_range(5)
    socks = []
    try:
        for port in range(base, base + 5):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            socks.append(sock)
    finally:
        for sock in socks:
            sock.close()
    assert len(socks) == 5


def test_free_port_is_below_the_ephemeral_range_and_bindable() -> None:
    """Outgoing connections take their source ports from the ephemeral range (32768+ here), so a
    port chosen there can be taken between the choice and the service's bind."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = free_port()
        assert port < low
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
