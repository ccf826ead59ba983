"""``rollout bench agents`` end to end on the one harness that needs no registry (the openai SDK
example agent of docs/agents.md): real engine, relay, proxy and Redis processes; the JSON carries
every key the issue names, the harness finished, and every call is exactly what the engine saw."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT, python_env

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(180)]

KEYS = {"route", "episodes", "finished", "token_exact", "merge_rate", "segments_per_episode", "calls", "mismatches",
        "gateway_added_latency_p50_ms", "errors", "error_detail"}  # fmt: skip


def test_agents_benchmark_reports_the_openai_sdk_agent_token_exact(tmp_path: Path) -> None:
    path = tmp_path / "agents.json"
    argv = ["bench", "agents", "--harness", "openai-sdk", "--tasks", "1", "--json", str(path)]
    out = subprocess.run([sys.executable, "-m", "services.cli", *argv], cwd=REPO_ROOT, env=python_env(),
                         capture_output=True, text=True, timeout=170)  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "harnesses token-exact: 1 of 1" in out.stdout
    doc = json.loads(path.read_text())
    assert (doc["harnesses_total"], doc["harnesses_token_exact"], doc["skipped"]) == (1, 1, {})
    sdk = doc["harnesses"]["openai-sdk"]
    assert set(sdk) == KEYS
    assert (sdk["episodes"], sdk["finished"], sdk["errors"], sdk["error_detail"]) == (1, 1, 0, [])
    assert (sdk["calls"], sdk["token_exact"], sdk["merge_rate"], sdk["segments_per_episode"]) == (2, 1.0, 1.0, 1.0)
    assert sdk["mismatches"] == 0 and sdk["route"] == "chat"
    assert sdk["gateway_added_latency_p50_ms"] >= 0
    assert set(doc["added_latency_p50_ms_by_route"]) == {"chat"}
