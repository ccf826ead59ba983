"""``rollout bench capacity`` end to end, tiny: it measures a real stack, writes its JSON, and the
JSON is consistent (linear scales, at least one shard, a check against the measured window)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services.benchmarks.capacity_model import ROLES
from tests.sandbox_broker.conftest import needs_bwrap
from tests.support.processes import REPO_ROOT, python_env

pytestmark = [needs_bwrap, pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(400)]


def test_capacity_benchmark_writes_a_consistent_model(tmp_path: Path) -> None:
    path = tmp_path / "capacity.json"
    argv = ["bench", "capacity", "--in-flight", "2", "--check-in-flight", "4", "--short-in-flight", "2",
            "--time-scale", "50", "--check-time-scale", "50", "--warmup-s", "1", "--window-s", "2", "--idle-s", "1",
            "--workers", "1", "--proxy-workers", "1", "--json", str(path)]  # fmt: skip
    out = subprocess.run([sys.executable, "-m", "services.cli", *argv], cwd=REPO_ROOT, env=python_env(),
                         capture_output=True, text=True, timeout=380)  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "first to saturate" in out.stdout and "check at N=4" in out.stdout
    doc = json.loads(path.read_text())
    assert set(doc["costs"]["ms_per_turn"]) == set(doc["costs"]["ms_per_lease"]) == set(ROLES)
    assert set(doc["windows"]) == {"idle", "small", "short", "check"}
    small, short = doc["windows"]["small"], doc["windows"]["short"]
    assert short["leases_per_turn"] >= small["leases_per_turn"]  # two turns per episode: a lease per two turns
    assert doc["costs"]["leases_per_turn"] == doc["workload_leases_per_turn"]
    seed, ten, hundred = doc["scales"]
    assert [s["factor"] for s in doc["scales"]] == [1, 10, 100]
    assert [s["turns_per_s"] for s in doc["scales"]] == [75.0, 750.0, 7500.0]
    for role in ROLES:
        assert ten["cores_by_role"][role] == pytest.approx(10 * seed["cores_by_role"][role])
        assert hundred["cores_by_role"][role] == pytest.approx(100 * seed["cores_by_role"][role])
    for scale in doc["scales"]:
        assert scale["redis_shards"] >= 1 and scale["first_to_saturate"] in ROLES
        assert scale["cores_total"] == pytest.approx(sum(scale["cores_by_role"].values()))
    assert seed["redis_shards"] <= ten["redis_shards"] <= hundred["redis_shards"]
    check = doc["check"]
    assert check["in_flight"] == 4 and check["turns_per_s"] > 0 and check["leases_per_s"] >= 0
    assert check["predicted_cpu_cores"] > 0 and check["measured_cpu_cores"] > 0
    assert check["ratio"] == pytest.approx(check["predicted_cpu_cores"] / check["measured_cpu_cores"])
    assert doc["costs"]["shard_ops_per_s"] > 0 and 0 < doc["workload_leases_per_turn"] <= 1
    assert sum(small["redis_commands_by_name"].values()) == pytest.approx(small["redis_ops_per_s"] * small["seconds"])
    assert "Redis commands per turn at N=2" in out.stdout


def test_bad_replicas_are_refused() -> None:
    out = subprocess.run([sys.executable, "-m", "services.cli", "bench", "capacity", "--replicas", "redis=2"],
                         cwd=REPO_ROOT, env=python_env(), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "ROLE=N" in out.stdout


def test_costs_of_an_earlier_run_without_costs_per_lease_still_plan(tmp_path: Path) -> None:
    costs = {"ms_per_turn": dict.fromkeys(ROLES, 1.0), "idle_cores": dict.fromkeys(ROLES, 0.01),
             "redis_ops_per_turn": 2.0, "redis_idle_ops_per_s": 10.0, "leases_per_turn": 0.02,
             "shard_ops_per_s": 50_000.0}  # fmt: skip
    (tmp_path / "old.json").write_text(json.dumps({"costs": costs}))
    out = subprocess.run([sys.executable, "-m", "services.cli", "bench", "capacity", "--costs-from",
                          str(tmp_path / "old.json"), "--json", str(tmp_path / "new.json")], cwd=REPO_ROOT,
                         env=python_env(), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    seed = json.loads((tmp_path / "new.json").read_text())["scales"][0]
    assert seed["cores_by_role"]["worker"] == pytest.approx((0.01 + 75 * 1.0 / 1000) / 0.7)  # no lease term
    assert seed["leases_per_s"] == pytest.approx(75 * 0.02)
