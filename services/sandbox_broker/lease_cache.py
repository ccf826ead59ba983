"""This process's copy of live lease records, so that a command on a lease needs no Redis round trip.

Why a cached record is never used for a lease that ended:

- every end of a lease goes through ``LeaseStore.claim`` (release, reaping, recovery after a
  restart, an abandoned start), and its script publishes the lease id on ``keys.leases_ended()``.
  Every replica listens and drops the id; this replica also drops it at once when it claims;
- an entry is used only until the lease's own expiry; past it the record is read again (a renewal
  on another replica moved it), and only ``live`` records are kept (not one being torn down);
- while the listener is not subscribed (starting, Redis unreachable, a reconnect) the cache holds
  nothing and stores nothing: every lookup reads Redis, as without a cache. A read that started
  before the subscription changed is not stored either (``epoch``), nor one whose end was already
  announced while it was in flight (``_ended``);
- a subscription that stops answering pings is treated as lost.

A record deleted from Redis by hand (not claimed) is not noticed until its expiry; nothing in the
platform does that. A store that lost every record (restarted empty) is noticed by the reaper,
which empties the cache (``forget_all``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from typing import Any

import redis
import redis.asyncio as aioredis

from services.protocol import keys
from services.runtime.outages import Outage
from services.runtime.tasks import cancel_and_wait
from services.sandbox_broker.leases import LeaseRecord

log = logging.getLogger(__name__)

PING_S = 5.0  # a silent subscription is pinged after this long, and dropped if still silent after as long again
RETRY_S = 1.0  # between attempts to subscribe again
MAX_ENTRIES = 100_000  # past this the cache starts over (the records are in Redis anyway)
ENDED_KEPT = 4096  # ids of recently ended leases, refused even if a read in flight returns them


class LeaseCache:
    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.channel = keys.leases_ended()
        self.subscribed = False
        self.epoch = 0  # changes whenever the subscription starts or stops
        self._records: dict[str, LeaseRecord] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self._outage = Outage("Redis (the ended-leases subscription; leases are read from Redis meanwhile)", log)

    def __len__(self) -> int:
        return len(self._records)

    def get(self, lease_id: str, now: float) -> LeaseRecord | None:
        """The cached live record, or None (not cached, or past its expiry: read Redis)."""
        record = self._records.get(lease_id)
        if record is not None and record.lease.expires_at < now:
            del self._records[lease_id]
            return None
        return record

    def put(self, record: LeaseRecord, epoch: int) -> None:
        """Keep a record read (or written) while the cache was at ``epoch``."""
        lease_id = record.lease.id
        if not self.subscribed or epoch != self.epoch or record.state != "live" or lease_id in self._ended:
            return
        if len(self._records) >= MAX_ENTRIES:
            self._records.clear()
        self._records[lease_id] = record

    def drop(self, lease_id: str) -> None:
        """The lease ended (claimed here or announced by any replica)."""
        self._records.pop(lease_id, None)
        self._ended[lease_id] = None
        if len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    def forget_all(self) -> None:
        """The store lost its state (``runtime/generation.py``): no cached record can be trusted, nor a
        read in flight."""
        self.epoch += 1
        self._records.clear()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._listen(), name="lease cache")

    async def close(self) -> None:
        await cancel_and_wait(self._task)

    async def _listen(self) -> None:
        while True:
            try:
                await self._subscribed_loop()
            except Exception as exc:  # Redis errors above all; whatever it is, lookups read Redis meanwhile
                self._outage.failed(exc)  # logged once per outage
            await asyncio.sleep(RETRY_S)

    async def _subscribed_loop(self) -> None:
        pubsub = self.client.pubsub()
        try:
            await pubsub.subscribe(self.channel)
            pinged: float | None = None
            while True:
                message = await pubsub.get_message(timeout=PING_S)
                if message is not None:
                    pinged = None
                    self._on_message(message)
                elif pinged is None:
                    await pubsub.ping()
                    pinged = time.monotonic()
                elif time.monotonic() - pinged >= PING_S:
                    raise redis.ConnectionError("the ended-leases subscription stopped answering")
        finally:
            self._unsubscribed()
            with contextlib.suppress(redis.RedisError, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]  # typed in redis-py 8

    def _on_message(self, message: dict[str, Any]) -> None:
        if message["type"] == "subscribe":
            self.subscribed = True
            self.epoch += 1
            self._outage.ok()
        elif message["type"] == "message":
            data = message["data"]
            self.drop(data.decode() if isinstance(data, bytes) else str(data))

    def _unsubscribed(self) -> None:
        self.subscribed = False
        self.epoch += 1
        self._records.clear()
