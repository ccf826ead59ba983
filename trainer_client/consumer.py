"""The consumer-group reader lives in :mod:`rollout_client.stream` (it exists once); these names stay importable."""

from rollout_client.stream import Entry, TrajectoryConsumer

__all__ = ["Entry", "TrajectoryConsumer"]
