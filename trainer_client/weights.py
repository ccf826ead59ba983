"""The weight transaction's client lives in :mod:`rollout_client.weights`; these names stay importable."""

from rollout_client.weights import SyncOutcome, WeightPublisher, job_pool

__all__ = ["SyncOutcome", "WeightPublisher", "job_pool"]
