"""The rollout API's HTTP contract, shared by the API service and its clients (trainers).

Routes (JSON; errors are ``ErrorBody``; auth is ``Authorization: Bearer <token>``):

- ``POST /jobs`` (admin token) JobCreate -> 201 JobCreated (the job token is shown once)
- ``GET /jobs/{job}`` -> JobStatus
- ``POST /rollouts`` RolloutRequest -> 202 RolloutAccepted (a repeated idempotency key answers
  with the first rollout and ``duplicate=True``; nothing is queued twice)
- ``GET /rollouts/{id}`` -> RolloutStatus
- ``DELETE /rollouts/{id}`` -> RolloutStatus (queued items dropped, running ones cancelled)
- ``GET /jobs/{job}/trajectories`` -> Server-Sent Events, ``id:`` is the stream entry id,
  ``data:`` the trajectory as JSON; resumable with ``Last-Event-ID``
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from services.protocol.tasks import DEFAULT_POOL, Name


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
