"""``rollout bench chaos --short`` end to end: kill -9 of Redis (AOF), the broker, a worker, the API
in the middle of a POST and the trainer, and the proxy kept down for 3 s, each while its rollout
runs, on a real fleet. Every trajectory is published exactly once, none is an infra failure scored
as the agent's, no lease or sandbox is left, and the trainer got every trajectory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sandbox_broker.conftest import needs_bwrap
from tests.support.processes import REPO_ROOT, python_env

pytestmark = [needs_bwrap, pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(400)]
# the faults that leave lease reservations cut short first: their reaping (about 80 s) overlaps the rest
SCENARIOS = ["redis_aof", "broker", "worker", "api_mid_post", "trainer", "proxy_outage"]


def test_the_short_chaos_suite_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "chaos.json"
    argv = ["bench", "chaos", "--short", "--scenarios", ",".join(SCENARIOS), "--json", str(path)]
    out = subprocess.run([sys.executable, "-m", "services.cli", *argv], cwd=REPO_ROOT, env=python_env(),
                         capture_output=True, text=True, timeout=380)  # fmt: skip
    assert path.exists(), out.stdout[-3000:] + out.stderr[-3000:]
    doc = json.loads(path.read_text())
    assert set(doc["scenarios"]) == set(SCENARIOS)
    for name, result in doc["scenarios"].items():
        assert result["finished"], (name, result)
        assert result["published"] == result["trajectories"] == 6, (name, result)
    assert (doc["lost"], doc["duplicated"], doc["infra_scored"], doc["leaked"]) == (0, 0, 0, 0), doc
    assert doc["scenarios"]["trainer"]["trainer_missing"] == doc["scenarios"]["trainer"]["trainer_pending"] == 0
    assert doc["recovery_s_max"] is not None and doc["recovery_s_max"] >= 0
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
