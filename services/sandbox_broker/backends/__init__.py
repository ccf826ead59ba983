"""Sandbox backends behind one Protocol (``base.Backend``), picked by ``ROLLOUT_BROKER_BACKEND``."""

from __future__ import annotations

from services.sandbox_broker.backends.base import Backend
from services.sandbox_broker.settings import BrokerSettings


def make_backend(settings: BrokerSettings) -> Backend:
    """The configured backend; docker and e2b import their SDKs only when chosen."""
    if settings.backend == "local":
        from services.sandbox_broker.backends.local import LocalBackend

        return LocalBackend(settings)
    if settings.backend == "docker":
        from services.sandbox_broker.backends.docker import DockerBackend

        return DockerBackend(settings)
    from services.sandbox_broker.backends.e2b import E2BBackend

    return E2BBackend(settings)
