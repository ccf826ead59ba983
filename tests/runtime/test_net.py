"""Loopback port helpers."""

from __future__ import annotations

import socket

from services.runtime.net import free_port_range


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
