"""``rollout_client``: the platform's client for any trainer (TRL, slime/miles, verl, the platform's own).

- :class:`RolloutClient` / :class:`AsyncRolloutClient` (:mod:`rollout_client.http`): create a job,
  submit tasks (plain or SWE-bench rows), follow a rollout, read the job's figures and its
  trajectories over HTTP;
- :class:`TrajectoryConsumer` / :class:`AsyncTrajectoryConsumer` (:mod:`rollout_client.stream`):
  read the job's trajectory stream through a Redis consumer group, exactly once and resumable;
- :class:`WeightPublisher` (:mod:`rollout_client.weights`): post new weights through the LLM
  proxy's weight-update transaction;
- typed errors after the API's error codes (:mod:`rollout_client.errors`).

Framework adapters sit beside it and import their framework only when imported themselves:
:mod:`rollout_client.trl` (TRL's ``GRPOTrainer(rollout_func=...)`` and a weight-sync callback).
"""

from rollout_client.errors import (
    BadRequest,
    Conflict,
    JobGone,
    NotFound,
    QuotaExceeded,
    RolloutApiError,
    Unauthorized,
    Unavailable,
)
from rollout_client.http import AsyncRolloutClient, RolloutClient, StreamedTrajectory
from rollout_client.stream import AsyncTrajectoryConsumer, Entry, TrajectoryConsumer
from rollout_client.weights import ExportDir, SyncOutcome, WeightPublisher, seal

__all__ = [
    "AsyncRolloutClient",
    "AsyncTrajectoryConsumer",
    "BadRequest",
    "Conflict",
    "Entry",
    "ExportDir",
    "JobGone",
    "NotFound",
    "QuotaExceeded",
    "RolloutApiError",
    "RolloutClient",
    "StreamedTrajectory",
    "SyncOutcome",
    "TrajectoryConsumer",
    "Unauthorized",
    "Unavailable",
    "WeightPublisher",
    "seal",
]
