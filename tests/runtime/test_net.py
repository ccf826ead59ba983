"""Loopback port helpers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from services.runtime import net
from services.runtime.net import free_port_range
from services.runtime.processes import python_env


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


def test_no_port_is_handed_out_twice_across_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four processes drawing ports at once from a narrow range get distinct ports (the registry
    is shared through its file and lock), each below the ephemeral range."""
    monkeypatch.setattr(net, "REGISTRY", tmp_path / "claims.json")
    script = (f"import sys; from pathlib import Path; from services.runtime import net\n"
              f"net.REGISTRY = Path({str(tmp_path / 'claims.json')!r}); net.LOW, net.HIGH = 20000, 20150\n"
              f"print(' '.join(str(net.free_port()) for _ in range(30)))")  # fmt: skip
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=python_env())
             for _ in range(4)]  # fmt: skip
    ports = [int(p) for proc in procs for p in proc.communicate(timeout=60)[0].split()]
    assert len(ports) == 120 and len(set(ports)) == 120 and all(20000 <= p < 20150 for p in ports)
    claims = json.loads((tmp_path / "claims.json").read_text())
    assert sorted(int(p) for p in claims) == sorted(ports)


def test_expired_claims_are_handed_out_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(net, "REGISTRY", tmp_path / "claims.json")
    monkeypatch.setattr(net, "LOW", 21000)
    monkeypatch.setattr(net, "HIGH", 21002)
    first = net.free_port()
    with pytest.raises(RuntimeError):
        net.free_port()  # the range holds one port, and it is claimed
    claims = json.loads((tmp_path / "claims.json").read_text())
    (tmp_path / "claims.json").write_text(json.dumps({port: 0.0 for port in claims}))  # expired
    assert net.free_port() == first
