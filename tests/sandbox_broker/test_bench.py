"""``rollout bench broker`` end to end on the local backend, small: it runs, writes its JSON, and
finds no errors and no leftover sandboxes (also after its kill -9 and restart)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.sandbox_broker.conftest import needs_bwrap
from tests.test_cli import rollout

pytestmark = [needs_bwrap, pytest.mark.slow]

KEYS = ("warm_lease_p50_ms", "warm_lease_p99_ms", "cold_lease_p50_ms", "cold_lease_p99_ms", "exec_overhead_p50_ms",
        "egress_cold_lease_p50_ms", "warm_lease_paced_p50_ms", "warm_lease_paced_p99_ms", "burst_floor_p50_ms",
        "burst_floor_p99_ms", "agent_start_p50_ms", "errors", "leaked")  # fmt: skip


def test_broker_benchmark_writes_its_figures(tmp_path: Path, redis_url: str) -> None:
    path = tmp_path / "broker.json"
    out = rollout("bench", "broker", "--leases", "4", "--exec-samples", "5", "--redis-url", redis_url,
                  "--json", str(path))  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    figures = json.loads(path.read_text())
    assert all(key in figures for key in KEYS)
    assert figures["errors"] == 0 and figures["leaked"] == 0
    assert figures["warm_hits"] == 4 and figures["cold_hits"] == 0 and figures["kill9_leases"] == 4
    assert figures["paced_leases"] == 4 and figures["paced_warm_hits"] == 4  # paced: the pool was refilled first
    assert 0 < figures["burst_floor_p50_ms"] <= figures["burst_floor_p99_ms"]  # the no-op server answered them all
    assert figures["agent_starts"] == 4 and figures["agent_start_p50_ms"] > 0  # each agent reached the upstream
    assert "warm lease" in out.stdout
