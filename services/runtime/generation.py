"""Telling a Redis that came back empty from one that was merely away.

The store holds one random id, ``keys.store_generation()``. Each service reads it now and then;
the first to find it missing sets a new one (``SET NX``). A service that saw another id before has
lost its store's state (no persistence, a wiped volume, a failover to an empty replica): it says so
once, at WARNING, and does what it must to be whole again (the proxy re-registers its configured
pools). An outage alone changes nothing: the id is still there when Redis answers again.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

import redis
from redis.asyncio import Redis as AsyncRedis

from services.protocol import keys
from services.runtime.outages import STORE_ERRORS, Outage

log = logging.getLogger(__name__)


class StoreGeneration:
    """What one service last saw of the store's generation."""

    def __init__(self, service: str, announce: bool = True) -> None:
        self.service = service
        self.announce = announce  # False: counted for /healthz, said by another process (the proxy's children)
        self.seen: str | None = None
        self.losses = 0  # times the store was found to have lost its state
        self.lost_at: float | None = None  # unix time of the last loss seen

    def observe(self, client: redis.Redis) -> bool:
        """Read (or set) the generation; True when it differs from the one seen last."""
        raw: Any = client.get(keys.store_generation())
        if raw is None:
            client.set(keys.store_generation(), secrets.token_hex(8), nx=True)
            raw = client.get(keys.store_generation())
        return self._saw(raw)

    async def observe_async(self, client: AsyncRedis) -> bool:
        """``observe`` with an asyncio client."""
        raw: Any = await client.get(keys.store_generation())
        if raw is None:
            await client.set(keys.store_generation(), secrets.token_hex(8), nx=True)
            raw = await client.get(keys.store_generation())
        return self._saw(raw)

    async def follow(self, client: AsyncRedis, period_s: float) -> None:
        """``observe_async`` every ``period_s`` until cancelled (an outage is logged once, and waited out)."""
        outage = Outage(f"Redis (store generation, {self.service})", log)
        while True:
            try:
                await self.observe_async(client)
                outage.ok()
            except STORE_ERRORS as exc:
                outage.failed(exc)
            await asyncio.sleep(period_s)

    def health(self) -> dict[str, Any]:
        """For ``/healthz``: nothing while the store never lost its state, else when it last did."""
        return {} if self.lost_at is None else {"store_lost": {"times": self.losses, "last_at": self.lost_at}}

    def _saw(self, raw: Any) -> bool:
        value = raw.decode() if isinstance(raw, bytes) else str(raw)
        lost = self.seen is not None and value != self.seen
        if lost:
            self.losses += 1
            self.lost_at = time.time()
        if lost and self.announce:
            log.warning("%s: Redis lost its state (store generation %s, now %s): restoring what this service "
                        "owns", self.service, self.seen, value)  # fmt: skip
        self.seen = value
        return lost
