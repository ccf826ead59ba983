"""Egress namespaces (backends/netns.py): made with their rules in one process, and the host's
addresses read at most once per burst."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

import pytest

from services.sandbox_broker.backends import netns


def test_a_namespace_is_made_with_its_rules_and_then_its_nat(tmp_path: Path) -> None:
    if problem := netns.probe(tmp_path / "probe"):
        pytest.skip(f"no isolated egress on this host: {problem}")
    try:
        netns.open_namespace(tmp_path, netns.ruleset(["203.0.113.7:443"], [ipaddress.ip_network("198.51.100.9")]))
        inside = [*netns.enter_prefix(tmp_path)]
        rules = subprocess.run([*inside, "nft", "list", "ruleset"], capture_output=True, text=True, check=True).stdout
        assert "table inet sandbox" in rules and "198.51.100.9" in rules and "203.0.113.7" in rules
        links = subprocess.run([*inside, "ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
        assert "tap0" in links  # slirp4netns attached after the rules
    finally:
        netns.close_namespace(tmp_path)
    assert not netns.ns_file(tmp_path).exists()


def test_the_hosts_networks_are_read_again_only_past_their_age(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []

    def read() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        reads.append(1)
        return [ipaddress.ip_network(f"192.0.2.{len(reads)}")]

    monkeypatch.setattr(netns, "_read_host_networks", read)
    monkeypatch.setattr(netns, "_networks", None)
    first = netns.host_networks(max_age_s=60)
    assert netns.host_networks(max_age_s=60) == first and len(reads) == 1  # a burst reads once
    assert netns.host_networks() != first and len(reads) == 2  # no age allowed: read now
    monkeypatch.setattr(netns, "_read_at", 0.0)  # long ago
    assert netns.host_networks(max_age_s=60) == [ipaddress.ip_network("192.0.2.3")]
