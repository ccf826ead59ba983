"""Field names of the counter hashes (``keys.job_stats``), shared by the API, the workers and
the Lua scripts that write them."""

from __future__ import annotations


def failed_attempts(stage: str) -> str:
    """Attempts that failed on infrastructure at ``stage``, retried or not."""
    return f"infra:{stage}"


def infra_error_trajectories(stage: str) -> str:
    """Trajectories given up as ``infra_error`` whose last failure was at ``stage``."""
    return f"infra_error:{stage}"
