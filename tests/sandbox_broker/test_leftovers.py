"""A broker killed in the middle of its start-up probes leaves a loop-mounted disk, an overlay mount
and a network namespace with slirp4netns running; the next broker on that state directory removes
them before it probes again. A broker stopped with a lease live keeps that sandbox mounted for its
restart; the owner of a state dir no broker will use again removes it (leftovers.remove_state_dir,
which every test's state dir goes through: a mount left after it fails the test)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from services.sandbox_broker.backends import disk, leftovers, netns, overlay
from services.sandbox_broker.backends.local import LocalBackend
from services.sandbox_broker.settings import BrokerSettings
from tests.sandbox_broker.conftest import BrokerFactory, lease, needs_bwrap

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
    disk.DiskImages(state_dir / disk.TEMPLATES).create(disk_dir, disk_dir / "disk", 8)
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


@pytest.mark.slow  # a broker process
def test_a_stopped_brokers_kept_sandbox_goes_with_its_state_dir(start_broker: BrokerFactory, state_dir: Path) -> None:
    broker = start_broker()
    with httpx.Client(base_url=broker.url, timeout=60) as client:
        held = lease(client)
    broker.stop()  # SIGTERM: the live lease's sandbox stays, mounted, for a restart
    sandbox = state_dir / "sandboxes" / held["sandbox_id"]
    assert [m for m in overlay.mounts_under(state_dir) if m.is_relative_to(sandbox)]
    assert leftovers.remove_state_dir(state_dir) == []  # nothing was left after its sandboxes went
    assert overlay.mounts_under(state_dir) == [] and not state_dir.exists()
