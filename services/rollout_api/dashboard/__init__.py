"""The fleet dashboard and trajectory viewer served by the rollout API under ``/ui``."""
