"""Per-step records: the JSONL step log, Prometheus gauges, and the step timer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from pydantic import BaseModel, Field

PHASES = ("wait_rollouts_s", "recompute_s", "update_s", "export_sync_s", "checkpoint_s")


class StepRecord(BaseModel):
    """One line of ``steps.jsonl``."""

    step: int
    version: str
    groups: int
    trajectories: int
    tokens: int  # generated tokens in the loss
    reward_mean: float
    response_len_mean: float  # response tokens (generated + tool) per trajectory
    generated_len_mean: float  # generated tokens per trajectory
    loss: float
    grad_norm: float
    clip_fraction: float
    logprob_gap: float
    ess: float
    tis_mean: float
    kl: float
    staleness: dict[str, int]  # versions behind -> trajectories
    drops: dict[str, int]  # this step, by reason (trajectories)
    dropped_groups: dict[str, int]  # this step, by reason
    carried_groups: int  # complete groups left for the next step
    in_flight_groups: int
    sync_ok: bool | None = None  # None: no export or no proxy this step
    lr: float = 0.0
    padding_share: float = 0.0  # share of computed token positions that were padding
    timings: dict[str, float] = Field(default_factory=dict)  # PHASES + total_s (rank 0)
    rank_timings: list[dict[str, float]] = Field(default_factory=list)  # the same, per rank in rank order

    def line(self) -> str:
        return self.model_dump_json() + "\n"


class StepTimer:
    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.phases: dict[str, float] = dict.fromkeys(PHASES, 0.0)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] += time.perf_counter() - t0

    def record(self) -> dict[str, float]:
        return {**self.phases, "total_s": time.perf_counter() - self.start}


class StepLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: StepRecord) -> None:
        with self.path.open("a") as f:
            f.write(record.line())

    def read(self) -> list[StepRecord]:
        if not self.path.exists():
            return []
        return [StepRecord.model_validate_json(line) for line in self.path.read_text().splitlines() if line.strip()]


class TrainerMetrics:
    """Prometheus gauges of the latest step (served on ``/metrics`` when a port is configured)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._server: WSGIServer | None = None
        self._thread = threading.Thread()
        self.step = Gauge("rollout_trainer_step", "last optimizer step", registry=self.registry)
        self.value = Gauge("rollout_trainer_step_value", "per-step figure", ["name"], registry=self.registry)
        self.phase = Gauge(
            "rollout_trainer_step_phase_seconds", "step time by phase", ["phase"], registry=self.registry
        )
        self.drops = Counter(
            "rollout_trainer_dropped_trajectories", "dropped trajectories", ["reason"], registry=self.registry
        )

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None

    def observe(self, record: StepRecord) -> None:
        self.step.set(record.step)
        for name in ("reward_mean", "response_len_mean", "loss", "grad_norm", "clip_fraction", "logprob_gap", "ess"):
            self.value.labels(name).set(getattr(record, name))
        for phase, seconds in record.timings.items():
            self.phase.labels(phase).set(seconds)
        for reason, n in record.drops.items():
            self.drops.labels(reason).inc(n)
