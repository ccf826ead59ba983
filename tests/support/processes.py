"""The tests' handle on real service subprocesses (shared with ``rollout up``)."""

from services.runtime.processes import (
    REPO_ROOT,
    ServiceProcess,
    launch_service,
    python_env,
    start_service,
    wait_started,
)

__all__ = ["REPO_ROOT", "ServiceProcess", "launch_service", "python_env", "start_service", "wait_started"]
