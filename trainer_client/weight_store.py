"""The weight store's publishing side lives in :mod:`rollout_client.weight_store`; this name stays importable."""

from rollout_client.weight_store import publish

__all__ = ["publish"]
