"""Egress namespaces (backends/netns.py): made with their rules in one process, the host's
addresses read at most once per burst, and the host's shared mounts left alone by slirp4netns."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

import pytest

from services.sandbox_broker.backends import mounts, netns


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


def test_slirp4netns_leaves_every_mount_below_a_shared_mount_of_the_host_in_place(tmp_path: Path) -> None:
    """A dockerd makes its data root a shared mount, with each running container's root filesystem
    mounted below it. slirp4netns's own sandbox (``--enable-sandbox``) makes only ``/`` private in
    its new mount namespace and then detaches the old root, which unmounted those container roots on
    the host too (their copies were peers): exec into every container failed ("unable to find user
    root"). Here a shared tmpfs with a mount below it stands in for the data root."""
    if problem := netns.probe(tmp_path / "probe"):
        pytest.skip(f"no isolated egress on this host: {problem}")
    shared, child = tmp_path / "shared", tmp_path / "shared" / "child"
    shared.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "shared", str(shared)], check=True)
    try:
        subprocess.run(["mount", "--make-shared", str(shared)], check=True)
        child.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "child", str(child)], check=True)
        sandbox = tmp_path / "sandbox"
        sandbox.mkdir()
        try:
            netns.open_namespace(sandbox, netns.ruleset([], []))  # slirp4netns is up: its sandbox is made
        finally:
            netns.close_namespace(sandbox)
        assert str(child) in mounts.mount_points(), "slirp4netns unmounted a mount of the host's"
    finally:
        mounts.detach(child)
        mounts.detach(shared)


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
