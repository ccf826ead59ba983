"""A broker killed in the middle of its start-up probes leaves a loop-mounted disk, an overlay mount
and a network namespace with slirp4netns running; the next broker on that state directory removes
them before it probes again."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from services.sandbox_broker.backends import disk, leftovers, netns, overlay
from services.sandbox_broker.backends.local import LocalBackend
from services.sandbox_broker.settings import BrokerSettings
from tests.sandbox_broker.conftest import needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root")]


def _dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def _slirps(path: Path) -> int:
    found = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found += str(path).encode() in (entry / "cmdline").read_bytes()
            except OSError:
                continue
    return found


def test_probe_leftovers_of_a_killed_broker_are_removed_at_start(state_dir: Path) -> None:
    pid = _dead_pid()
    disk_dir, overlay_dir = leftovers.probe_dir(state_dir, "disk", pid), leftovers.probe_dir(state_dir, "overlay", pid)
    disk_dir.mkdir()
    disk.create(disk_dir, disk_dir / "disk", 8)
    layers = [overlay_dir / d for d in ("lower", "upper", "work", "merged")]
    for d in layers:
        d.mkdir(parents=True)
    overlay.mount(*layers)
    netns_dir = leftovers.probe_dir(state_dir, "netns", pid)
    egress = netns.probe(state_dir / "scratch") == ""  # slirp4netns and nft are there
    if egress:
        netns_dir.mkdir()
        netns.open_namespace(netns_dir, netns.ruleset([], []))
    assert len(overlay.mounts_under(state_dir)) == 2 + egress and _slirps(netns_dir) == egress

    async def start_and_stop() -> None:
        backend = LocalBackend(BrokerSettings(state_dir=state_dir))
        await backend.start()
        await backend.close()

    asyncio.run(start_and_stop())
    assert overlay.mounts_under(state_dir) == [] and _slirps(netns_dir) == 0
    assert not [p for p in state_dir.iterdir() if "-probe-" in p.name]
