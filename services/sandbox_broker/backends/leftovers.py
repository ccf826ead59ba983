"""What local brokers leave behind on a state directory, and its removal.

Probes: each start-up probe works in ``<state_dir>/<kind>-probe-<pid>``: a loop-mounted disk image
(``disk``), a network namespace with its slirp4netns process (``netns``), an overlay mount
(``overlay``). A broker killed mid-probe leaves these mounted (and slirp4netns running); the next
broker on the same state directory removes every probe directory whose broker is gone before it
probes again.

Sandboxes: a broker that stops keeps the sandboxes of live leases, so that it (or a replacement
with its instance name) finds and recovers them after a restart; a killed one keeps everything.
Whoever owns a state directory that no broker will use again (a test, a benchmark, ``rollout
demo``) removes them with :func:`remove_sandboxes` once the brokers are gone, or the whole
directory with :func:`remove_state_dir`, which also reports any mount still left under it.

Processes: a bubblewrap orphaned mid-setup (:func:`kill_orphans`) is killed by the next broker to
start on the state directory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
from pathlib import Path

from services.sandbox_broker.backends import disk, imageroot, mounts, netns, overlay
from services.sandbox_broker.backends.bwrap import SandboxPaths
from services.sandbox_broker.backends.cgroups import Cgroups

log = logging.getLogger(__name__)

KINDS = ("overlay", "disk", "netns", "gvisor")


def probe_dir(state_dir: Path, kind: str, pid: int) -> Path:
    return state_dir / f"{kind}-probe-{pid}"


def clean_probes(state_dir: Path) -> list[Path]:
    """Remove the probe directories of brokers that are gone (their mounts, namespace, slirp4netns)."""
    removed = []
    for kind in KINDS:
        for path in state_dir.glob(f"{kind}-probe-*"):
            pid = path.name.rpartition("-")[2]
            if pid.isdigit() and Path(f"/proc/{pid}").exists():
                continue  # a live broker's probe, now
            netns.close_namespace(path)
            overlay.unmount_under(path)
            disk.release(path, path / "disk")
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        log.info("removed %d probe directories left by killed brokers: %s", len(removed), [p.name for p in removed])
    return removed


def clean_after_brokers(state_dir: Path) -> None:
    """What brokers that are gone left on ``state_dir`` that a new one must end before it starts:
    orphaned bubblewraps (``kill_orphans``), then probe directories (``clean_probes``)."""
    kill_orphans(state_dir / "sandboxes")
    clean_probes(state_dir)


def kill_orphans(root: Path) -> list[int]:
    """Kill every bubblewrap that names a sandbox under ``root`` and whose parent is gone (it was
    reparented to pid 1: one adopted by a subreaper is not found); return their pids.

    A live sandbox's bubblewraps are the zygote's child and that child's child, and each dies with its
    parent (``--die-with-parent``), except the child in the moment before it has a parent-death
    signal: it waits on an eventfd for its parent to write its uid map, and an orphan waits there
    forever (pid 1 of an empty pid namespace, holding a copy of the launch namespace with the
    sandboxes' mounts). The zygote kills those it leaves (``Zygote.take``); this is the start-up
    check that none survived a broker or zygote killed outright. Processes are matched by name,
    command line and parent: a live bubblewrap's parent is the zygote or another bubblewrap, and a
    sandbox's own processes, whatever their name, have theirs in the sandbox (its agent reaps its
    orphans)."""
    killed = []
    for pid, name in processes_naming(f"{root}/"):
        if name != "bwrap":
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            if int(status.partition("\nPPid:")[2].split(None, 1)[0]) == 1:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        except (OSError, ValueError, IndexError):  # ended meanwhile
            continue
    if killed:
        log.warning("killed %d orphaned bubblewraps of sandboxes under %s: %s", len(killed), root, killed)
    return killed


def processes_naming(marker: str) -> list[tuple[int, str]]:
    """The processes whose command line contains ``marker`` (a state directory, a sandbox's path):
    their pids and names."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append((int(entry.name), (entry / "comm").read_text().strip()))
    return found


def teardown(paths: SandboxPaths) -> None:
    """Remove a sandbox's namespace, mounts and directory (its processes must be gone); idempotent.

    Its mounts are detached by name, deepest first, without reading the host's mount table (which
    lists every sandbox's mounts: 800 lines at 384 sandboxes): a name that is not mounted costs one
    failed system call. These are every mount a sandbox gets; the tests' state directories check
    that none is ever left (``remove_state_dir``)."""
    netns.close_namespace(paths.root)  # the namespace file's bind mount
    for point in sandbox_mounts(paths):
        mounts.detach(point)
    disk.image(paths.root).unlink(missing_ok=True)
    shutil.rmtree(paths.root, ignore_errors=True)


def remove_sandbox(cgroups: Cgroups, sandbox_id: str, paths: SandboxPaths) -> None:
    """A sandbox's processes and cgroups, then its namespace, mounts and directory (one call: a broker
    runs it in one worker thread)."""
    cgroups.remove(sandbox_id)
    teardown(paths)


def sandbox_mounts(paths: SandboxPaths) -> list[Path]:
    """Where a sandbox may have a mount, deepest first: a seeded workspace's overlay (inside the
    disk), the image's root overlay, the disk (``disk.py``)."""
    return [paths.workspace, imageroot.root_dir(paths), paths.disk]


def remove_sandboxes(state_dir: Path) -> list[str]:
    """Remove every sandbox left under ``state_dir`` with no broker running (tests, benchmarks, the
    demo): its processes, cgroups, namespace, mounts and directory; return their ids."""
    root = state_dir / "sandboxes"
    left = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    cgroups = Cgroups.probe(512, Cgroups.scope_of(root))
    for sandbox_id in left:
        remove_sandbox(cgroups, sandbox_id, SandboxPaths(root / sandbox_id))
    cgroups.remove_scope()
    return left


def remove_state_dir(state_dir: Path) -> list[Path]:
    """Delete the state directory of brokers that have all stopped for good: their sandboxes and
    probes first, then the tree. Returns the mounts that were still under it after that (a leak:
    callers in tests fail on it); those are detached too, so that a leak does not pile up on the host."""
    if state_dir.resolve() in (Path("/"), Path(tempfile.gettempdir()).resolve(), Path.home().resolve()):
        raise ValueError(f"refusing to remove {state_dir}: not a broker's own state dir")  # every mount under it
    if not state_dir.exists():
        return []
    remove_sandboxes(state_dir)
    clean_probes(state_dir)
    leaked = overlay.mounts_under(state_dir)  # /proc/self/mountinfo
    overlay.unmount_under(state_dir)
    shutil.rmtree(state_dir, ignore_errors=True)
    if leaked:
        log.warning("mounts were left under %s after its sandboxes were removed: %s", state_dir, leaked)
    return leaked
