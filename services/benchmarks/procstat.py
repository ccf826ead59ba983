"""CPU time of processes, read from Linux ``/proc/<pid>/stat`` (one reader for every benchmark)."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class ProcCpu:
    pid: int
    ppid: int
    session: int
    own_s: float  # utime + stime
    reaped_children_s: float  # cutime + cstime: children it has waited for


def processes() -> list[ProcCpu]:
    """Every live process that could be read."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command name, from field 3
        except OSError:
            continue
        own, reaped = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])  # fields 14-17
        found.append(ProcCpu(int(stat.parent.name), int(fields[1]), int(fields[3]), own / CLOCK_TICKS,
                             reaped / CLOCK_TICKS))  # fmt: skip
    return found


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every live descendant."""
    table = processes()
    children: dict[int, list[int]] = {}
    for p in table:
        children.setdefault(p.ppid, []).append(p.pid)
    own = {p.pid: p.own_s for p in table}
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += own.get(current, 0.0)
        todo += children.get(current, [])
    return total


def session_cpu_s(sessions: dict[int, str]) -> dict[str, float]:
    """CPU seconds per name of each session id: its live processes plus the children they reaped."""
    totals = dict.fromkeys(sessions.values(), 0.0)
    for p in processes():
        if (name := sessions.get(p.session)) is not None:
            totals[name] += p.own_s + p.reaped_children_s
    return totals


def tree_total_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants, each with the children it reaped: a process
    tree's whole cost so far, its exited members included once they were waited for."""
    return trees_total_cpu_s({pid: "tree"})["tree"]


def trees_total_cpu_s(roots: dict[int, str]) -> dict[str, float]:
    """:func:`tree_total_cpu_s` of each root pid, summed per name, from one read of ``/proc``. A tree
    holds the descendants that started sessions of their own (a broker's zygote and its sandboxes),
    which :func:`session_cpu_s` leaves out."""
    table = processes()
    children: dict[int, list[int]] = {}
    for p in table:
        children.setdefault(p.ppid, []).append(p.pid)
    total_of = {p.pid: p.own_s + p.reaped_children_s for p in table}
    totals = dict.fromkeys(roots.values(), 0.0)
    for root, name in roots.items():
        todo = [root]
        while todo:
            current = todo.pop()
            totals[name] += total_of.get(current, 0.0)
            todo += children.get(current, [])
    return totals


def host_cpu_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of every core since boot, from ``/proc/stat``'s first line; idle and
    iowait are not busy."""
    with open("/proc/stat") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


async def settle(max_busy: float = 0.2, window_s: float = 0.5, timeout_s: float = 30.0) -> tuple[float, float]:
    """Wait until the host's cores were busy less than ``max_busy`` of a ``window_s`` window (the
    kernel's deferred work included: a released sandbox's network namespace is freed by a kernel
    worker after its processes are gone), or ``timeout_s``; returns (seconds waited, the last
    window's busy share). A latency burst measured right after hundreds of sandboxes were released
    would otherwise time that clean-up as well."""
    started = time.monotonic()
    busy_share = 1.0
    while True:
        busy, total = host_cpu_ticks()
        await asyncio.sleep(window_s)
        busy_after, total_after = host_cpu_ticks()
        busy_share = (busy_after - busy) / max(total_after - total, 1)
        if busy_share < max_busy or time.monotonic() - started >= timeout_s:
            return time.monotonic() - started, busy_share


def reference_cpu_ms(iterations: int = 300_000) -> float:
    """The CPU time of a fixed pure-Python loop in this process: the host's speed at that moment. On
    the shared virtual machine these benchmarks run on, the same loop took 64 to 130 ms within one
    idle minute (issue 32), and every CPU figure moves with it: two figures compare when measured
    beside similar references."""
    started, total = time.process_time(), 0
    for i in range(iterations):
        total += i
    return (time.process_time() - started) * 1000
