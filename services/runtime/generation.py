"""Telling a Redis that came back empty from one that was merely away.

The store holds one random id, ``keys.store_generation()``. Each service reads it now and then;
the first to find it missing sets a new one (``SET NX``). A service that saw another id before has
lost its store's state (no persistence, a wiped volume, a failover to an empty replica): it says so
once, at WARNING, and does what it must to be whole again (the proxy re-registers its configured
pools). An outage alone changes nothing: the id is still there when Redis answers again.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

import redis

from services.protocol import keys

log = logging.getLogger(__name__)


class StoreGeneration:
    """What one service last saw of the store's generation."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.seen: str | None = None
        self.losses = 0  # times the store was found to have lost its state

    def observe(self, client: redis.Redis) -> bool:
        """Read (or set) the generation; True when it differs from the one seen last."""
        raw: Any = client.get(keys.store_generation())
        if raw is None:
            client.set(keys.store_generation(), secrets.token_hex(8), nx=True)
            raw = client.get(keys.store_generation())
        value = raw.decode() if isinstance(raw, bytes) else str(raw)
        lost = self.seen is not None and value != self.seen
        if lost:
            self.losses += 1
            log.warning("%s: Redis lost its state (store generation %s, now %s): restoring what this service "
                        "owns", self.service, self.seen, value)  # fmt: skip
        self.seen = value
        return lost
