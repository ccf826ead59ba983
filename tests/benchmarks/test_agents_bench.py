"""``rollout bench agents`` end to end on the openai SDK example agent of docs/agents.md: real
engine, relay, proxy and Redis processes; the JSON carries every key the issue names, the harness
finished, and every call is exactly what the engine saw. On the host (``--where host``: no registry
needed) and inside a local task sandbox from its agent bundle (the default: a real broker; the
bundle is built once per machine into /var/cache/rollout-agents, skipped with the reason where it
cannot be)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT, python_env

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]

KEYS = {"route", "episodes", "finished", "token_exact", "merge_rate", "segments_per_episode", "calls", "mismatches",
        "gateway_added_latency_p50_ms", "errors", "error_detail"}  # fmt: skip


@pytest.mark.parametrize("where", ["host", "sandbox"])
def test_agents_benchmark_reports_the_openai_sdk_agent_token_exact(tmp_path: Path, where: str) -> None:
    path = tmp_path / "agents.json"
    argv = ["bench", "agents", "--harness", "openai-sdk", "--tasks", "1", "--where", where, "--json", str(path)]
    out = subprocess.run([sys.executable, "-m", "services.cli", *argv], cwd=REPO_ROOT, env=python_env(),
                         capture_output=True, text=True, timeout=560)  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    doc = json.loads(path.read_text())
    if where == "sandbox" and "openai-sdk" in doc["skipped"]:
        pytest.skip(doc["skipped"]["openai-sdk"])  # its bundle could not be built here (no registry)
    assert "harnesses token-exact: 1 of 1" in out.stdout and doc["where"] == where
    assert (doc["harnesses_total"], doc["harnesses_token_exact"], doc["skipped"]) == (1, 1, {})
    sdk = doc["harnesses"]["openai-sdk"]
    assert set(sdk) == KEYS
    assert (sdk["episodes"], sdk["finished"], sdk["errors"], sdk["error_detail"]) == (1, 1, 0, [])
    assert (sdk["calls"], sdk["token_exact"], sdk["merge_rate"], sdk["segments_per_episode"]) == (2, 1.0, 1.0, 1.0)
    assert sdk["mismatches"] == 0 and sdk["route"] == "chat"
    assert sdk["gateway_added_latency_p50_ms"] >= 0
    assert set(doc["added_latency_p50_ms_by_route"]) == {"chat"}
