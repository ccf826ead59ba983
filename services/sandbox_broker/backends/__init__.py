"""Sandbox backends behind one Protocol (``base.Backend``), picked by ``ROLLOUT_BROKER_BACKEND``."""

from __future__ import annotations

from services.sandbox_broker.backends.base import Backend
from services.sandbox_broker.settings import BrokerSettings


def make_backend(settings: BrokerSettings) -> Backend:
    """The configured backend; docker and e2b import their SDKs only when chosen."""
    if settings.backend == "local":
        from services.sandbox_broker.backends.local import LocalBackend

        return LocalBackend(settings)
    raise NotImplementedError(f"the {settings.backend} backend has not landed yet")
