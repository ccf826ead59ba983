"""Held-out evaluation on the same fleet while training goes on: pass@1 (and pass@k) per weight version.

The trainer submits the held-out tasks as one rollout of a separate evaluation job (same proxy
pool, so the same engines and weights; its own trajectory stream, so nothing of it is ever trained
on), with fixed sampling (``temperature``; ``samples`` attempts per task), and reads the
rewards of that rollout's trajectories from the evaluation job's stream. It evaluates between
two weight updates (the trainer posts nothing meanwhile), so every turn of every evaluated
episode comes from one version: :attr:`EvalRecord.versions` records what the turns say.

Infrastructure failures are not failures of the policy: they are counted and left out of pass@k.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from services.protocol import from_stream_fields, keys
from services.protocol.status import Status
from services.protocol.tasks import AgentLimits, Name, RolloutRequest, SamplingParams, Task
from services.protocol.trajectory import Trajectory
from trainer_client.client import RolloutClient

logger = logging.getLogger(__name__)


class EvalConfig(BaseModel):
    """``ROLLOUT_TRAIN_EVALUATION__*``: held-out pass@1 before SFT, after it, every ``every`` GRPO steps, at the end."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks_path: Path | None = None  # held-out tasks (JSONL of Task); None: no evaluation
    job: Name | None = None  # the evaluation job (same pool as the training job)
    token: str | None = Field(None, repr=False)  # its bearer token
    every: int = Field(5, ge=1)  # GRPO steps between evaluations
    samples: int = Field(1, ge=1)  # attempts per task (pass@k with k = samples)
    temperature: float = Field(1.0, ge=0)  # 0: greedy
    before_sft: bool = True  # also evaluate the initial weights
    timeout_s: float = Field(1800.0, gt=0)


class EvalRecord(BaseModel):
    """One evaluation (a line of ``evals.jsonl``)."""

    phase: str  # "base", "sft", "grpo"
    step: int  # optimizer steps so far (SFT included)
    grpo_step: int
    version: str
    tasks: int
    trajectories: int  # scored (infra errors excluded)
    infra_errors: int
    pass_at_1: float
    pass_at_k: float
    k: int
    versions: list[str]  # weight versions named by the evaluated turns
    seconds: float


def pass_at_k(rewards_by_task: dict[str, list[float]], k: int) -> tuple[float, float]:
    """(pass@1, pass@k) over tasks: mean success per attempt, and share of tasks with a success in k attempts."""
    if not rewards_by_task:
        return 0.0, 0.0
    per_task = [sum(r >= 1.0 for r in rs) / len(rs) for rs in rewards_by_task.values()]
    solved = [any(r >= 1.0 for r in rs[:k]) for rs in rewards_by_task.values()]
    return sum(per_task) / len(per_task), sum(solved) / len(solved)


class Evaluator:
    def __init__(self, config: EvalConfig, api_url: str, redis_url: str, limits: AgentLimits, tasks: list[Task]):
        if not config.job:
            raise ValueError("ROLLOUT_TRAIN_EVALUATION__JOB is required with ROLLOUT_TRAIN_EVALUATION__TASKS_PATH")
        self.config, self.limits, self.tasks = config, limits, tasks
        self.client = RolloutClient(api_url, config.token)
        self.redis = redis.Redis.from_url(redis_url)
        self.stream = keys.trajectory_stream(config.job)

    def evaluate(self, phase: str, step: int, grpo_step: int, version: str) -> EvalRecord:
        c = self.config
        started = time.monotonic()
        last = self._last_id()
        request = RolloutRequest(
            job=c.job or "", tasks=self.tasks, group_size=c.samples, limits=self.limits,
            sampling=SamplingParams(temperature=c.temperature), idempotency_key=f"eval-{version}-{phase}",
        )  # fmt: skip
        accepted = self.client.submit(request)
        trajectories = self._collect(accepted.rollout_id, accepted.tasks * c.samples, last, started)
        record = self._record(trajectories, phase, step, grpo_step, version, time.monotonic() - started)
        logger.info("held-out pass@1 %.3f (pass@%d %.3f) on %d tasks, %s weights %s (%.0fs)", record.pass_at_1,
                    record.k, record.pass_at_k, record.tasks, phase, version, record.seconds)  # fmt: skip
        return record

    def _last_id(self) -> str:
        newest: Any = self.redis.xrevrange(self.stream, count=1)
        return newest[0][0].decode() if newest else "0-0"

    def _collect(self, rollout_id: str, total: int, last: str, started: float) -> dict[str, Trajectory]:
        found: dict[str, Trajectory] = {}
        with tqdm(total=total, desc="held-out eval", unit="ep", leave=False) as bar:
            while len(found) < total:
                if time.monotonic() - started > self.config.timeout_s:
                    raise TimeoutError(f"evaluation rollout {rollout_id}: {len(found)}/{total} after the timeout")
                reply: Any = self.redis.xread({self.stream: last}, count=500, block=500)
                for entry_id, fields in reply[0][1] if reply else []:
                    last = entry_id.decode()
                    traj = from_stream_fields(fields)
                    if traj.rollout_id == rollout_id and traj.trajectory_id not in found:
                        found[traj.trajectory_id] = traj
                        bar.update(1)
        return found

    def _record(self, found: dict[str, Trajectory], phase: str, step: int, grpo_step: int, version: str,
                seconds: float) -> EvalRecord:  # fmt: skip
        by_task: dict[str, list[float]] = defaultdict(list)
        infra = 0
        versions: set[str] = set()
        for traj in found.values():
            versions.update(turn.weight_version for turn in traj.turns)
            if traj.status is Status.INFRA_ERROR or traj.reward is None:
                infra += 1
                continue
            by_task[traj.task_id].append(traj.reward)
        p1, pk = pass_at_k(by_task, self.config.samples)
        return EvalRecord(
            phase=phase, step=step, grpo_step=grpo_step, version=version, tasks=len(by_task),
            trajectories=sum(len(r) for r in by_task.values()), infra_errors=infra, pass_at_1=p1, pass_at_k=pk,
            k=self.config.samples, versions=sorted(versions), seconds=seconds,
        )  # fmt: skip

    def close(self) -> None:
        self.client.close()
        self.redis.close()
