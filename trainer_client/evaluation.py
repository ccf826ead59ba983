"""Held-out evaluation on the same fleet while training goes on: pass@1 (and pass@k) per weight version.

The trainer submits the held-out tasks as one evaluation rollout (``mode="eval"``) of a separate
job on the same proxy pool (so the same engines and weights): its trajectories go to the job's
evaluation stream, never to a trainer, every sample is drawn with its own fixed sampling seed, and
the API scores it (``GET /rollouts/{id}/eval``: pass@k, samples by status, turns by weight version).
It evaluates between two weight updates (the trainer posts nothing meanwhile), so every turn of
every evaluated episode comes from one version: :attr:`EvalRecord.versions` records what the turns say.

Infrastructure failures are not failures of the policy: the API counts them apart and leaves them
out of pass@k.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from rollout_client.http import RolloutClient
from services.protocol.api import EvalReport
from services.protocol.fields import Name
from services.protocol.tasks import MAX_SEED, AgentLimits, EvalOptions, RolloutRequest, SamplingParams, Task

logger = logging.getLogger(__name__)

POLL_S = 0.5


class EvalConfig(BaseModel):
    """``ROLLOUT_TRAIN_EVALUATION__*``: held-out pass@1 before SFT, after it, every ``every`` GRPO steps, at the end."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks_path: Path | None = None  # held-out tasks (JSONL of Task); None: no evaluation
    job: Name | None = None  # the evaluation job (same pool as the training job; may be the training job)
    token: str | None = Field(None, repr=False)  # its bearer token
    every: int = Field(5, ge=1)  # GRPO steps between evaluations
    samples: int = Field(1, ge=1)  # attempts per task (pass@k with k = samples)
    temperature: float = Field(1.0, ge=0)  # 0: greedy
    seed: int = Field(0, ge=0, le=MAX_SEED - 1024)  # sampling seeds (the same for every evaluation of a run)
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
    by_status: dict[str, int] = Field(default_factory=dict)  # trajectories by final status


class Evaluator:
    def __init__(self, config: EvalConfig, api_url: str, limits: AgentLimits, tasks: list[Task]):
        if not config.job:
            raise ValueError("ROLLOUT_TRAIN_EVALUATION__JOB is required with ROLLOUT_TRAIN_EVALUATION__TASKS_PATH")
        self.config, self.limits, self.tasks = config, limits, tasks
        self.client = RolloutClient(api_url, config.token)

    def evaluate(self, phase: str, step: int, grpo_step: int, version: str) -> EvalRecord:
        c = self.config
        started = time.monotonic()
        request = RolloutRequest(
            job=c.job or "", tasks=self.tasks, group_size=c.samples, limits=self.limits,
            sampling=SamplingParams(temperature=c.temperature), idempotency_key=f"eval-{version}-{phase}",
            mode="eval", eval=EvalOptions(seed=c.seed, k=sorted({1, c.samples})),
        )  # fmt: skip
        accepted = self.client.submit(request)
        report = self._wait(accepted.rollout_id, started)
        record = self._record(report, phase, step, grpo_step, version, time.monotonic() - started)
        logger.info("held-out pass@1 %.3f (pass@%d %.3f) on %d tasks, %s weights %s (%.0fs)", record.pass_at_1,
                    record.k, record.pass_at_k, record.tasks, phase, version, record.seconds)  # fmt: skip
        return record

    def _wait(self, rollout_id: str, started: float) -> EvalReport:
        """Poll the API's report until every sample has its final record."""
        report = self.client.eval_report(rollout_id)
        with tqdm(total=report.total, desc="held-out eval", unit="ep", leave=False) as bar:
            while not report.complete:
                if time.monotonic() - started > self.config.timeout_s:
                    raise TimeoutError(f"evaluation rollout {rollout_id}: {report.finished}/{report.total} "
                                       "after the timeout")  # fmt: skip
                time.sleep(POLL_S)
                report = self.client.eval_report(rollout_id)
                bar.update(report.finished - bar.n)
        return report

    def _record(self, report: EvalReport, phase: str, step: int, grpo_step: int, version: str,
                seconds: float) -> EvalRecord:  # fmt: skip
        k = self.config.samples
        return EvalRecord(
            phase=phase, step=step, grpo_step=grpo_step, version=version, tasks=report.tasks_scored.get("1", 0),
            trajectories=sum(t.samples for t in report.tasks), infra_errors=report.by_status.get("infra_error", 0),
            pass_at_1=report.pass_at_1 or 0.0, pass_at_k=report.pass_at.get(str(k)) or 0.0, k=k,
            versions=sorted(report.weight_versions), seconds=seconds, by_status=report.by_status,
        )  # fmt: skip

    def close(self) -> None:
        self.client.close()
