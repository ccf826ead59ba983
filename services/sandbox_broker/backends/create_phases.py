"""Where a cold sandbox's creation goes, phase by phase: wall seconds, this process's CPU seconds in
the phase's thread, and the CPU of the children it waited for meanwhile (``RUSAGE_CHILDREN``).

Summed since the backend started. Phases of creates that overlap share the process's children
counter, so per-phase CPU is exact only for creates one at a time (``rollout bench broker`` measures
one that way); the wall seconds and the counts are exact either way. Exported in the broker's
/metrics as ``rollout_broker_create_phase_*`` (``metrics.PhaseCollector``).
"""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

# in the order a local sandbox goes through them
PHASES = ("image", "disk", "layout", "egress", "overlay", "cgroup", "agent", "setup")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class PhaseClock:
    wall_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    cpu_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    children_cpu_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    count: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PHASES, 0))
    # a benchmark's reading of all the CPU of this process and its descendants (a cgroup's), if set
    group_cpu: Callable[[], float] | None = None
    group_cpu_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as ``name`` (in the thread that runs it: ``time.thread_time``)."""
        wall, cpu, children = time.monotonic(), time.thread_time(), _children_cpu_s()
        group = self.group_cpu() if self.group_cpu else 0.0
        try:
            yield
        finally:
            self.wall_s[name] += time.monotonic() - wall
            self.cpu_s[name] += time.thread_time() - cpu
            self.children_cpu_s[name] += _children_cpu_s() - children
            self.count[name] += 1
            if self.group_cpu:
                self.group_cpu_s[name] += self.group_cpu() - group

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Per phase: wall, own and children CPU seconds, and how many times it ran."""
        return {name: {"wall_s": self.wall_s[name], "cpu_s": self.cpu_s[name],
                       "children_cpu_s": self.children_cpu_s[name], "count": float(self.count[name]),
                       "group_cpu_s": self.group_cpu_s[name]}
                for name in PHASES}  # fmt: skip
