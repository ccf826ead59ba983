"""A cgroup v1 ``cpuacct`` group for a benchmark's service: the CPU of every process started under
it, exited or orphaned ones included (a sandbox's processes outlive the bubblewrap that started
them, so a process tree's waited-for CPU misses theirs). The sandboxes' own groups are in the
memory, cpu and pids hierarchies only, so they stay in this one."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/cpuacct")


class CpuGroup:
    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def make(cls, name: str, root: Path = ROOT) -> CpuGroup | None:
        """A new group, or None where the host has no writable cpuacct hierarchy."""
        path = root / f"rollout-bench-{name}-{os.getpid()}"
        try:
            path.mkdir()
        except OSError:
            return None
        return cls(path)

    def join(self, pid: int) -> None:
        """Move ``pid`` in; the processes it starts from then on are counted too."""
        (self.path / "cgroup.procs").write_text(str(pid))

    @contextlib.contextmanager
    def holding_self(self) -> Iterator[None]:
        """This process in the group for the block, then back in the group it was in."""
        before = own_group()
        self.join(os.getpid())
        try:
            yield
        finally:
            if before is not None:
                (before / "cgroup.procs").write_text(str(os.getpid()))

    def cpu_s(self) -> float:
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def remove(self) -> None:
        """The group, once its processes are gone (a leftover one keeps it: left, harmless)."""
        with contextlib.suppress(OSError):
            self.path.rmdir()


def own_group(root: Path = ROOT) -> Path | None:
    """This process's cpuacct group (``/proc/self/cgroup``)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            return root / path.lstrip("/")
    return None
