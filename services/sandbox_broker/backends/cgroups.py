"""Per-sandbox resource limits through cgroup v1 (memory, cpu, pids), where the host lets us write.

cgroup v2 is used when its unified hierarchy has the controllers; on hybrid hosts (v1 controllers
mounted, v2 with none) v1 is used. Each sandbox gets one group per controller under
``rollout-broker/<sandbox_id>``; killing the sandbox kills every process listed in its groups.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from services.protocol.sandboxes import Resources

log = logging.getLogger(__name__)

ROOT = Path("/sys/fs/cgroup")
PARENT = "rollout-broker"
V1_CONTROLLERS = ("memory", "cpu", "pids")
CFS_PERIOD_US = 100_000


@dataclass(frozen=True, slots=True)
class Cgroups:
    """cgroup v1 groups of the sandboxes, or nothing when the host does not allow them.

    ``scope`` keeps the groups of one state directory apart from those of brokers using another
    (``rollout-broker/<scope>/<sandbox_id>``), so that no broker reaps another's sandboxes."""

    mode: str  # "v1" or "none"
    pids_max: int = 512
    scope: str = "default"
    root: Path = ROOT

    @classmethod
    def probe(cls, pids_max: int, scope: str, root: Path = ROOT) -> Cgroups:
        for controller in V1_CONTROLLERS:
            base = root / controller / PARENT / scope
            try:
                base.mkdir(parents=True, exist_ok=True)
                probe = base / f"probe-{os.getpid()}"
                probe.mkdir(exist_ok=True)
                probe.rmdir()
            except OSError as exc:
                log.info("cgroup v1 %s not writable (%s): limits fall back to rlimits", controller, exc)
                return cls("none", pids_max, scope, root)
        return cls("v1", pids_max, scope, root)

    @staticmethod
    def scope_of(state_dir: Path) -> str:
        return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]

    def _dirs(self, sandbox_id: str) -> list[Path]:
        return [self.root / c / PARENT / self.scope / sandbox_id for c in V1_CONTROLLERS]

    def procs_files(self, sandbox_id: str) -> list[Path]:
        """The ``cgroup.procs`` files a sandbox's command joins; empty without cgroups."""
        if self.mode == "none":
            return []
        return [d / "cgroup.procs" for d in self._dirs(sandbox_id)]

    def create(self, sandbox_id: str, resources: Resources, pids_max: int | None = None) -> None:
        """The sandbox's groups; ``pids_max`` overrides the host-wide limit (gVisor's own processes)."""
        if self.mode == "none":
            return
        memory, cpu, pids = self._dirs(sandbox_id)
        for d in (memory, cpu, pids):
            d.mkdir(parents=True, exist_ok=True)  # parents: the scope may have been removed while empty
        limit = str(resources.memory_mb * 1024 * 1024)
        (memory / "memory.limit_in_bytes").write_text(limit)
        (cpu / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
        (cpu / "cpu.cfs_quota_us").write_text(str(int(resources.cpus * CFS_PERIOD_US)))
        (pids / "pids.max").write_text(str(pids_max or self.pids_max))

    def exists(self, sandbox_id: str) -> bool:
        return self.mode == "none" or all(d.is_dir() for d in self._dirs(sandbox_id))

    def kill(self, sandbox_id: str) -> int:
        """SIGKILL every process in the sandbox's groups; how many were signalled.

        A pid read from ``cgroup.procs`` may be reaped and given to another host process before the
        signal (pid_max is 32768 here, and fork bombs in other sandboxes churn through it), so each
        is held by a pidfd, the groups are read again, and only a pid still listed is signalled,
        through its pidfd: a reused pid is never signalled (by number it would be)."""
        if self.mode == "none":
            return 0
        handles: dict[int, int | None] = {}
        for pid in self._pids(sandbox_id):
            try:
                handles[pid] = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            except OSError:  # no pidfd here (or out of descriptors): by number, as before
                handles[pid] = None
        try:
            still = self._pids(sandbox_id)
            signalled = 0
            for pid, fd in handles.items():
                if pid not in still:
                    continue
                with contextlib.suppress(ProcessLookupError):
                    if fd is None:
                        os.kill(pid, signal.SIGKILL)
                    else:
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                    signalled += 1
            return signalled
        finally:
            for fd in handles.values():
                if fd is not None:
                    os.close(fd)

    def _pids(self, sandbox_id: str) -> set[int]:
        pids: set[int] = set()
        for procs in self.procs_files(sandbox_id):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
        return pids

    def remove(self, sandbox_id: str) -> None:
        """Kill what is left and remove the groups (retrying while the kernel reaps)."""
        if self.mode == "none":
            return
        for attempt in range(100):  # killed processes leave their group when the kernel has reaped them
            self.kill(sandbox_id)
            leftover = [d for d in self._dirs(sandbox_id) if d.exists() and not _rmdir(d)]
            if not leftover:
                return
            time.sleep(min(0.1, 0.005 * (attempt + 1)))
        log.warning("cgroups of %s could not be removed yet; the orphan sweep will retry", sandbox_id)

    def remove_scope(self) -> None:
        """Remove this state directory's (empty) parent groups; a group still in use stays."""
        if self.mode == "none":
            return
        for controller in V1_CONTROLLERS:
            _rmdir(self.root / controller / PARENT / self.scope)

    def list_ids(self) -> list[str]:
        if self.mode == "none":
            return []
        base = self.root / "pids" / PARENT / self.scope
        return [d.name for d in base.iterdir() if d.is_dir()] if base.is_dir() else []


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False
