"""A broker killed in the middle of its start-up probes leaves a loop-mounted disk, an overlay mount
and a network namespace with slirp4netns running; the next broker on that state directory removes
them before it probes again. A broker stopped with a lease live keeps that sandbox mounted for its
restart; the owner of a state dir no broker will use again removes it (leftovers.remove_state_dir,
which every test's state dir goes through: a mount left after it fails the test)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
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
    return len(leftovers.processes_naming(str(path)))


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


def _orphan(argv: list[str]) -> int:
    """Start ``argv`` as an orphan (its parent exits at once: it is reparented to pid 1); its pid."""
    shell = " ".join(shlex.quote(arg) for arg in argv) + " >/dev/null 2>&1 & echo $!"
    pid = int(subprocess.run(["sh", "-c", shell], capture_output=True, text=True, check=True).stdout)
    ppid = Path(f"/proc/{pid}/status").read_text().partition("\nPPid:")[2].split()[0]
    if ppid != "1":
        os.kill(pid, signal.SIGKILL)
        pytest.skip(f"orphans are adopted by a subreaper ({ppid}) here, not by pid 1")
    return pid


def _gone(pid: int) -> bool:
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists():
            return True
        time.sleep(0.02)
    return False


def test_orphaned_bubblewraps_of_its_sandboxes_are_killed_at_start(state_dir: Path, tmp_path: Path) -> None:
    """A bubblewrap whose parent died mid-setup (pid 1 adopted it) and that names a sandbox of this
    state dir is killed when the next broker starts on it; a live one (its parent still there), one
    of another state dir and a process of another name are not. Stand-ins: a shell copied under the
    name ``bwrap``, blocked opening a FIFO."""
    fake, fifo = tmp_path / "bwrap", tmp_path / "fifo"
    shutil.copy("/bin/sh", fake)
    os.mkfifo(fifo)
    wait = f"read x < {fifo}"
    ours = str(state_dir / "sandboxes" / "s1" / "agent.log")
    orphan = _orphan([str(fake), "-c", wait, "bwrap", ours])
    elsewhere = _orphan([str(fake), "-c", wait, "bwrap", str(tmp_path / "sandboxes" / "s1")])
    other_name = _orphan(["sh", "-c", wait, "sh", ours])
    live = subprocess.Popen(["sh", "-c", f"{shlex.quote(str(fake))} -c {shlex.quote(wait)} bwrap {ours}; true"])
    spared = [elsewhere, other_name]
    try:
        for _ in range(100):  # the live one's bubblewrap is there
            children = Path(f"/proc/{live.pid}/task/{live.pid}/children").read_text().split()
            if children:
                break
            time.sleep(0.02)
        spared.append(int(children[0]))

        async def start_and_stop() -> None:
            backend = LocalBackend(BrokerSettings(state_dir=state_dir))
            await backend.start()
            await backend.close()

        asyncio.run(start_and_stop())
        assert _gone(orphan)
        assert [pid for pid in spared if not Path(f"/proc/{pid}").exists()] == []
    finally:
        for pid in (orphan, *spared):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        live.wait()


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
