"""The rollout API's HTTP contract, shared by the API service and its clients (trainers).

Routes (JSON; errors are ``ErrorBody``; auth is ``Authorization: Bearer <token>``):

- ``POST /jobs`` (admin token) JobCreate -> 201 JobCreated (the job token is shown once)
- ``GET /jobs/{job}`` -> JobStatus
- ``POST /rollouts`` RolloutRequest -> 202 RolloutAccepted (a repeated idempotency key answers
  with the first rollout and ``duplicate=True``; nothing is queued twice)
- ``GET /rollouts/{id}`` -> RolloutStatus
- ``GET /rollouts/{id}/eval`` -> EvalReport (rollouts submitted with ``mode="eval"``; 409 otherwise)
- ``DELETE /rollouts/{id}`` -> RolloutStatus (queued items dropped, running ones cancelled)
- ``GET /jobs/{job}/trajectories`` -> Server-Sent Events, ``id:`` is the stream entry id,
  ``data:`` the trajectory as JSON; resumable with ``Last-Event-ID``; ``?mode=eval`` reads the
  job's evaluation stream instead
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from services.protocol.fields import DEFAULT_POOL, Name


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class JobQuotas(_Model):
    max_queued: int = Field(100_000, ge=1, le=100_000_000)  # work items waiting in the job's stream
    max_in_flight: int = Field(10_000, ge=1, le=10_000_000)  # episodes running at once


class JobCreate(_Model):
    """Written by an admin (or a trainer holding the admin token)."""

    job: Name
    pool: Name = DEFAULT_POOL  # the proxy pool that serves this job's policy
    weight: float = Field(1.0, gt=0, le=1_000)  # fair-share weight against other jobs
    quotas: JobQuotas = Field(default_factory=JobQuotas)


class JobCreated(_Model):
    job: str
    token: str  # bearer token for this job's routes; shown only here


class RolloutAccepted(_Model):
    rollout_id: str
    job: str
    tasks: int
    trajectories: int  # tasks x group_size work items queued
    duplicate: bool = False  # the idempotency key was seen before; nothing new was queued


class TailFigures(_Model):
    episode_p50_s: float | None = None
    episode_p99_s: float | None = None
    tail_share_after_90pct: float | None = None  # share of rollout time after 90% of trajectories finished
    turn_cap_hit_rate: float | None = None


class RolloutStatus(_Model):
    rollout_id: str
    job: str
    total: int
    queued: int
    in_flight: int
    finished: int
    by_status: dict[str, int]  # Status value -> count
    cancelled: bool = False
    tail: TailFigures = Field(default_factory=TailFigures)
    mode: str = "train"  # "eval": see ``GET /rollouts/{id}/eval``


class SampleResult(_Model):
    """One finished sample of an evaluation rollout (written by the worker as it publishes)."""

    task_id: str
    sample_index: int
    status: str  # a Status value
    reward: float | None  # None for infra_error and cancelled: not scored
    weight_versions: list[str] = Field(default_factory=list)  # per turn


class EvalTaskResult(_Model):
    task_id: str
    rewards: list[float | None]  # by sample index; None: unfinished, infra_error or cancelled
    samples: int  # n: samples scored (completed or truncated)
    passed: int  # c: scored samples with reward >= threshold
    pass_at: dict[str, float | None]  # "k" -> this task's estimate; None when n < k


class EvalReport(_Model):
    """``GET /rollouts/{id}/eval``: pass@k of an evaluation rollout, over the samples finished so far.

    pass@k of a task with n scored samples of which c passed is the unbiased estimator
    1 - C(n-c, k) / C(n, k) (Chen et al. 2021, "Evaluating Large Language Models Trained on Code");
    the rollout's is the mean over the tasks with n >= k (``tasks_scored``).
    """

    rollout_id: str
    job: str
    complete: bool  # every sample has its final record
    total: int  # samples requested (tasks x group_size)
    finished: int
    seed: int
    threshold: float
    pass_at_1: float | None
    pass_at: dict[str, float | None]  # "k" -> mean over tasks; 1 and every requested k
    tasks_scored: dict[str, int]  # "k" -> tasks with at least k scored samples
    mean_reward: float | None  # over scored samples
    by_status: dict[str, int]
    weight_versions: dict[str, int]  # turns served by each weight version
    tasks: list[EvalTaskResult]


class JobStatus(_Model):
    job: str
    pool: str
    weight: float
    quotas: JobQuotas
    queue_depth: int
    in_flight: int
    finished: int
    trajectories_per_hour: float | None = None
    by_status: dict[str, int]
    # infrastructure failures, counted two ways: every failed attempt (retried or not), and the
    # trajectories given up as infra_error (by the stage of their last failure)
    infra_failed_attempts_by_stage: dict[str, int]
    infra_error_trajectories_by_stage: dict[str, int]
    infra_error_rate: float | None = None  # trajectories: infra_error / finished
    tail: TailFigures = Field(default_factory=TailFigures)
