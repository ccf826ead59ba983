"""One cold sandbox's creation, phase by phase (local backend): sandboxes created and destroyed one
at a time in the benchmark's own process, so each phase's CPU is its own (``create_phases.py``)."""

from __future__ import annotations

import contextlib
import resource
from typing import Any

from services.benchmarks.cpuacct import CpuGroup
from services.protocol.sandboxes import Resources, Template
from services.sandbox_broker.backends import make_backend
from services.sandbox_broker.backends.base import LABEL_LEASE, SandboxSpec
from services.sandbox_broker.backends.create_phases import PHASES, PhaseClock
from services.sandbox_broker.settings import BrokerSettings


def _cpu_s() -> float:
    """This process's CPU and that of the children it waited for (a destroyed sandbox's agent)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


async def one_at_a_time(settings: BrokerSettings, template: Template, resources: Resources, lease_id: str,
                        n: int = 3) -> dict[str, Any]:  # fmt: skip
    """``n`` sandboxes created and destroyed in turn, labelled with a live lease (the broker's reaper
    spares them): per sandbox, the whole create's CPU and wall, and each phase's. With a writable
    cpuacct hierarchy, this process sits in a group of its own meanwhile: ``all_cpu_ms`` counts every
    process of the phase (a started agent's too, which ``children_cpu_ms`` misses while it lives)."""
    backend = make_backend(settings)
    await backend.start()
    clock = getattr(backend, "phases", None)
    assert isinstance(clock, PhaseClock), "the phases are the local backend's"
    zygote = getattr(getattr(backend, "agents", None), "zygote", None)
    if zygote is not None:  # the agents' zygote starts once per broker: not counted in one sandbox's phases
        await zygote.start()
    spec = SandboxSpec(template, resources, "none", {LABEL_LEASE: lease_id})
    group = CpuGroup.make("phases")
    before, cpu_before = clock.snapshot(), _cpu_s()
    try:
        with group.holding_self() if group else contextlib.nullcontext():
            clock.group_cpu = group.cpu_s if group else None
            for _ in range(n):
                sandbox = await backend.create(spec)
                await backend.destroy(sandbox.sandbox_id)
            whole_ms = group.cpu_s() * 1000 / n if group else float("nan")
    finally:
        await backend.close()
        if group:
            group.remove()
    after = clock.snapshot()
    phases = {name: {"wall_ms": (after[name]["wall_s"] - before[name]["wall_s"]) * 1000 / n,
                     "cpu_ms": (after[name]["cpu_s"] - before[name]["cpu_s"]) * 1000 / n,
                     "children_cpu_ms": (after[name]["children_cpu_s"] - before[name]["children_cpu_s"]) * 1000 / n,
                     "all_cpu_ms": (after[name]["group_cpu_s"] - before[name]["group_cpu_s"]) * 1000 / n
                     if group else float("nan")}
              for name in PHASES}  # fmt: skip
    return {"cold_create_alone_cpu_ms": (_cpu_s() - cpu_before) * 1000 / n, "cold_create_phases": phases,
            "cold_create_alone_samples": n, "cold_create_alone_all_cpu_ms": whole_ms}  # fmt: skip
