"""The cold-create phase clock (create_phases.py) and its /metrics families."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client import CollectorRegistry, generate_latest

from services.sandbox_broker.backends.create_phases import PHASES, PhaseClock
from services.sandbox_broker.metrics import PhaseCollector


def test_a_phase_counts_its_wall_time_and_its_children_cpu() -> None:
    clock = PhaseClock()
    with clock.phase("setup"):  # a child that burns CPU, waited for inside the phase
        subprocess.run([sys.executable, "-c", "sum(range(3_000_000))"], check=True)
    with clock.phase("cgroup"):
        pass
    figures = clock.snapshot()
    assert set(figures) == set(PHASES)
    assert figures["setup"]["count"] == 1 and figures["setup"]["wall_s"] > 0
    assert figures["setup"]["children_cpu_s"] > 0 and figures["cgroup"]["children_cpu_s"] == 0
    assert figures["agent"] == {"wall_s": 0.0, "cpu_s": 0.0, "children_cpu_s": 0.0, "count": 0.0,
                                "group_cpu_s": 0.0}  # fmt: skip


def test_the_phases_are_exported_as_counters() -> None:
    clock = PhaseClock()
    with clock.phase("disk"):
        pass
    registry = CollectorRegistry()
    registry.register(PhaseCollector(clock))
    text = generate_latest(registry).decode()
    assert 'rollout_broker_create_phases_total{phase="disk"} 1.0' in text
    assert 'rollout_broker_create_phase_seconds_total{phase="egress"} 0.0' in text
    assert "rollout_broker_create_phase_children_cpu_seconds_total" in text
