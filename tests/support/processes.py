"""The tests' handle on real service subprocesses (shared with ``rollout up``)."""

from services.runtime.processes import REPO_ROOT, ServiceProcess, python_env, start_service

__all__ = ["REPO_ROOT", "ServiceProcess", "python_env", "start_service"]
