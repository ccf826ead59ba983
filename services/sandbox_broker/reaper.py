"""The reaper: expired leases (one replica wins each, by an atomic claim in Redis), sandboxes with
no lease (orphans: a crash between create and record, a dead replica's warm pool, leftovers), and
recovery after a restart (live leases whose sandbox is found are kept, the others ended)."""

from __future__ import annotations

import asyncio
import logging
import time

import redis
import redis.asyncio as aioredis

from services.protocol import keys
from services.runtime.outages import STORE_ERRORS, Outage
from services.runtime.tasks import cancel_and_wait
from services.sandbox_broker.backends.base import LABEL_BROKER, LABEL_LEASE, Sandbox
from services.sandbox_broker.broker import Broker
from services.sandbox_broker.leases import LeaseRecord

log = logging.getLogger(__name__)

# a sandbox of ours younger than this plus the create timeout may still be on its way into a pool (a
# pool's create has no lease to name it by: only its age says it may still be starting)
ORPHAN_GRACE_S = 30.0
LOCK_S = 60


class Reaper:
    def __init__(self, broker: Broker, client: aioredis.Redis) -> None:
        self.broker = broker
        self.client = client
        self.outage = Outage("Redis", log)  # the reaper loop logs an outage once
        self.settings = broker.settings
        self.metrics = broker.metrics
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Announce this replica, recover or end what a previous run left, then sweep in the background."""
        await self.heartbeat()
        await self.recover()
        await self.sweep_orphans(startup=True)
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="reaper")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def retire(self) -> None:
        """Say this replica is gone (its leftovers become orphans for the others at once)."""
        try:
            await self.client.delete(keys.broker_instance(self.broker.instance))
        except redis.RedisError as exc:
            log.warning("could not retire instance %s: %s", self.broker.instance, exc)

    async def heartbeat(self) -> None:
        ttl_ms = int(max(3 * self.settings.reap_interval_s, 2.0) * 1000)
        await self.client.set(keys.broker_instance(self.broker.instance), str(time.time()), px=ttl_ms)

    async def _loop(self) -> None:
        last_orphans = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.reap_interval_s)
            try:
                await self.heartbeat()
                await self.reap_expired()
                if time.monotonic() - last_orphans >= self.settings.orphan_interval_s:
                    last_orphans = time.monotonic()
                    await self.sweep_orphans()
                await self._observe()
                self.outage.ok()
            except STORE_ERRORS as exc:
                self.outage.failed(exc)
            except Exception:
                log.exception("reaper pass failed; next pass in %.1fs", self.settings.reap_interval_s)

    async def reap_expired(self) -> int:
        """End every lease past its deadline that this replica wins the claim for."""
        reaped = 0
        now = time.time()
        for lease_id in await self.broker.store.expired(now):
            claimed = await self.broker.store.claim(lease_id, now)
            if claimed is False:
                continue  # renewed meanwhile, or another replica took it
            if isinstance(claimed, LeaseRecord) and claimed.lease.backend == self.broker.backend.name:
                await self._destroy(claimed.lease.sandbox_id, "expired")
            await self.broker.store.forget(lease_id)
            reaped += 1
            log.info("lease %s expired and was reaped", lease_id)
        if reaped:
            self.broker.admission.poke()
        return reaped

    async def recover(self) -> None:
        """After a restart: this replica's live leases whose sandbox still exists carry on; the rest end."""
        present = {s.sandbox_id for s in await self.broker.backend.list_sandboxes()}
        for lease in await self.broker.store.list(None):
            record = await self.broker.store.get(lease.id)
            if record is None or record.owner != self.broker.instance:
                continue
            if lease.sandbox_id in present:
                self.metrics.recovered.inc()
                log.info("recovered lease %s (sandbox %s)", lease.id, lease.sandbox_id)
                continue
            if await self.broker.store.claim(lease.id) is not False:
                await self.broker.store.forget(lease.id)
                self.metrics.reaped.labels("lost").inc()
                log.warning("lease %s lost its sandbox %s while the broker was down", lease.id, lease.sandbox_id)

    async def sweep_orphans(self, startup: bool = False) -> int:
        """Destroy labelled sandboxes that no lease, pool or live replica accounts for."""
        sandboxes = await self.broker.backend.list_sandboxes()
        if not sandboxes:
            return 0
        # the pool's first, then the leases': a pooled sandbox handed out while the leases are read is
        # in the first (taken after it) or in the second (recorded before it), never in neither
        owned = self.broker.pools.owned()
        leased = await self.broker.store.live_sandbox_ids()
        reaped = 0
        for sandbox in sandboxes:
            if sandbox.sandbox_id in leased or sandbox.sandbox_id in owned:
                continue
            if await self._accounted_for(sandbox, startup):
                continue
            if await self.client.set(
                keys.sandbox_reap_lock(sandbox.sandbox_id), self.broker.instance, nx=True, ex=LOCK_S
            ):
                await self._destroy(sandbox.sandbox_id, "orphan")
                reaped += 1
                log.info("reaped orphan sandbox %s (labels %s)", sandbox.sandbox_id, sandbox.labels)
        return reaped

    async def _accounted_for(self, sandbox: Sandbox, startup: bool) -> bool:
        lease_id = sandbox.labels.get(LABEL_LEASE)
        if lease_id and await self.broker.store.exists(lease_id):
            return True  # a lease being created or torn down
        owner = sandbox.labels.get(LABEL_BROKER)
        if owner and owner != self.broker.instance:
            return bool(await self.client.exists(keys.broker_instance(owner)))
        young = time.time() - sandbox.created_at < self.settings.create_timeout_s + ORPHAN_GRACE_S
        return young and not startup

    async def _destroy(self, sandbox_id: str, reason: str) -> None:
        try:
            await self.broker.backend.destroy(sandbox_id)
        except Exception:
            log.exception("could not destroy sandbox %s (%s); will retry", sandbox_id, reason)
            return
        self.metrics.reaped.labels(reason).inc()

    async def _observe(self) -> None:
        self.metrics.leases.set(await self.broker.store.count())
        self.metrics.job_leases.clear()
        for job, count in (await self.broker.store.job_counts()).items():
            self.metrics.job_leases.labels(job).set(count)
