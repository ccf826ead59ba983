"""The docker firewall's rules for one sandbox bridge, IPv4 and IPv6, installed and removed on this
host's real iptables (a bridge name no interface has: the rules match nothing here)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from services.sandbox_broker.backends import docker_firewall

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("iptables") and shutil.which("ip6tables")), reason="needs root and iptables"
)


def _rules(binary: str, bridge: str) -> list[str]:
    out = subprocess.run([binary, "-S"], capture_output=True, text=True, check=False).stdout
    return [line for line in out.splitlines() if bridge in line]


def test_rules_cover_ipv4_and_ipv6_and_go_away() -> None:
    bridge = f"rbt{os.getpid() % 100000}"
    try:
        docker_firewall.install(bridge)
        docker_firewall.install(bridge)  # re-asserted at every start: no duplicates
        assert docker_firewall.installed(bridge) and docker_firewall.installed6(bridge)
        v6 = _rules("ip6tables", bridge)
        assert len(v6) == 4 and all("REJECT" in rule for rule in v6)
        assert sum(f"-i {bridge} " in rule for rule in _rules("iptables", bridge)) == 3
    finally:
        docker_firewall.remove(bridge)
    assert _rules("iptables", bridge) == [] and _rules("ip6tables", bridge) == []
