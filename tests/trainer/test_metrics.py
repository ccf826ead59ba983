"""Step records: the JSONL log round-trips, Prometheus serves the breakdown, the plot is drawn."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from services.runtime.net import free_port
from trainer_client.metrics import PHASES, StepLog, StepRecord, TrainerMetrics
from trainer_client.plot import plot_steps

pytestmark = [pytest.mark.trainer]


def record(step: int) -> StepRecord:
    return StepRecord(
        step=step, version=str(step), groups=2, trajectories=8, tokens=100, reward_mean=0.5, response_len_mean=20,
        generated_len_mean=12.5, loss=-0.1, grad_norm=0.7, clip_fraction=0.01, logprob_gap=0.011, ess=0.93,
        tis_mean=0.99, kl=0.0, staleness={"0": 6, "1": 2}, drops={"infra_error": 1}, dropped_groups={},
        carried_groups=1, in_flight_groups=3, sync_ok=True,
        timings={**dict.fromkeys(PHASES, 0.25), "update_s": 1.5, "total_s": 2.5},
    )  # fmt: skip


def test_step_log_round_trip_and_plot(tmp_path: Path) -> None:
    log = StepLog(tmp_path / "steps.jsonl")
    for step in (1, 2, 3):
        log.append(record(step))
    records = log.read()
    assert records == [record(1), record(2), record(3)]
    assert plot_steps(records, tmp_path / "steps.png").stat().st_size > 10_000


def test_metrics_endpoint_serves_the_breakdown() -> None:
    metrics = TrainerMetrics()
    port = free_port()
    metrics.serve(port)
    try:
        metrics.observe(record(4))
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        metrics.close()
    assert "rollout_trainer_step 4.0" in text
    assert 'rollout_trainer_step_phase_seconds{phase="update_s"} 1.5' in text
    assert 'rollout_trainer_dropped_trajectories_total{reason="infra_error"} 1.0' in text
    assert 'rollout_trainer_step_value{name="ess"} 0.93' in text
