"""CPU time of processes, read from Linux ``/proc/<pid>/stat`` (one reader for every benchmark)."""

from __future__ import annotations

import os
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
