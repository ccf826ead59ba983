"""The reaper: expired leases (one replica wins each, by an atomic claim in Redis), sandboxes with
no lease (orphans: a crash between create and record, a dead replica's warm pool, leftovers), and
recovery after a restart (live leases whose sandbox is found are kept, the others ended).

A store that comes back empty (``runtime/generation.py``) took every lease record with it: the
reaper notices it on its next pass, empties the lease cache, registers the templates it knows again
and destroys at once every sandbox of this replica that was leased before the loss (their leases no
longer exist; a young one is not spared, as a mere orphan would be while it may still be starting).
At the broker's stop a last sweep, with nothing starting any more, destroys whatever no lease
record accounts for: what is left on the host after a stop is only what a live lease still holds.
"""

from __future__ import annotations

import asyncio
import logging
import time

import redis
import redis.asyncio as aioredis

from services.protocol import keys
from services.runtime.outages import STORE_ERRORS, Outage
from services.runtime.tasks import cancel_and_wait
from services.sandbox_broker.backends.base import LABEL_BROKER, LABEL_LEASE, LABEL_POOL, Sandbox
from services.sandbox_broker.broker import Broker
from services.sandbox_broker.leases import LeaseRecord

log = logging.getLogger(__name__)

# a sandbox of ours younger than this plus the create timeout may still be on its way into a pool (a
# pool's create has no lease to name it by: only its age says it may still be starting)
ORPHAN_GRACE_S = 30.0
LOCK_S = 60
DESTROYS_AT_ONCE = 8  # a sweep's destroys in parallel (each unmounts and removes a cgroup)


class Reaper:
    def __init__(self, broker: Broker, client: aioredis.Redis) -> None:
        self.broker = broker
        self.client = client
        self.outage = Outage("Redis", log)  # the reaper loop logs an outage once
        self.settings = broker.settings
        self.metrics = broker.metrics
        self._task: asyncio.Task[None] | None = None
        self._beats: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Announce this replica, recover or end what a previous run left, then sweep in the background."""
        await self.broker.generation.observe_async(self.client)
        await self.heartbeat()
        await self.recover()
        await self.sweep_orphans(startup=True)
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="reaper")
        self._beats = asyncio.get_running_loop().create_task(self._beat(), name="reaper heartbeat")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        await cancel_and_wait(self._beats)

    async def final_sweep(self) -> None:
        """At the broker's stop, once nothing starts sandboxes any more (``Broker.quiesce``): destroy
        every sandbox of ours that no lease record accounts for, whatever its age. Leased ones stay
        (the next start recovers them). With Redis away nothing can be told apart: they all stay."""
        try:
            if await self.broker.generation.observe_async(self.client):
                self.broker.cache.forget_all()
            reaped = await self.sweep_orphans(final=True)
        except STORE_ERRORS as exc:
            log.warning("no last orphan sweep at stop (Redis: %s); the next start sweeps them", exc)
            return
        if reaped:
            log.info("reaped %d sandboxes no lease accounts for at stop", reaped)

    async def retire(self) -> None:
        """Say this replica is gone (its leftovers become orphans for the others at once)."""
        try:
            await self.client.delete(keys.broker_instance(self.broker.instance))
        except redis.RedisError as exc:
            log.warning("could not retire instance %s: %s", self.broker.instance, exc)

    async def heartbeat(self) -> None:
        ttl_ms = int(max(3 * self.settings.reap_interval_s, 2.0) * 1000)
        await self.client.set(keys.broker_instance(self.broker.instance), str(time.time()), px=ttl_ms)

    async def _beat(self) -> None:
        """The heartbeat on a timer of its own, not once per reaper pass: a pass slowed by a long sweep
        (hundreds of destroys on a busy host) let the instance key lapse, and while it is gone the
        workers' claims drop this replica's warm offers and its peers take its pool for a dead
        replica's orphans. An outage is the reaper loop's to log."""
        while True:
            await asyncio.sleep(self.settings.reap_interval_s)
            try:
                await self.heartbeat()
            except STORE_ERRORS:
                pass
            except Exception:
                log.exception("heartbeat failed; next in %.1fs", self.settings.reap_interval_s)

    async def _loop(self) -> None:
        last_orphans = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.reap_interval_s)
            try:
                if await self.broker.generation.observe_async(self.client):
                    await self.store_lost()
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

    async def store_lost(self) -> None:
        """The store came back empty: forget cached leases, restore templates, reap what was leased."""
        self.broker.cache.forget_all()
        restored = await self.broker.templates.restore()
        reaped = await self.sweep_orphans()
        self.broker.admission.poke()  # the limits' counts started again from nothing
        log.warning("store lost: %d sandboxes whose leases it held were reaped, %d templates registered again",
                    reaped, restored)  # fmt: skip

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

    async def sweep_orphans(self, startup: bool = False, final: bool = False) -> int:
        """Destroy labelled sandboxes that no lease, pool or live replica accounts for (``startup``,
        ``final``: nothing is starting, so a young one is not spared either)."""
        sandboxes = await self.broker.backend.list_sandboxes()
        if not sandboxes:
            return 0
        # the pool's first, then the leases': a pooled sandbox handed out while the leases are read is
        # in the first (taken after it) or in the second (recorded before it), never in neither
        pool_creates = self.broker.pools.creating()  # before ``owned``: a create done since is in it
        owned = self.broker.pools.owned()
        leased = await self.broker.store.live_sandbox_ids()
        doomed: list[tuple[Sandbox, str]] = []
        for sandbox in sandboxes:
            if sandbox.sandbox_id in leased or sandbox.sandbox_id in owned:
                continue
            reason = await self._reason(sandbox, startup or final, pool_creates > 0)
            if reason is None:
                continue
            if await self.client.set(
                keys.sandbox_reap_lock(sandbox.sandbox_id), self.broker.instance, nx=True, ex=LOCK_S
            ):
                doomed.append((sandbox, reason))
        gate = asyncio.Semaphore(DESTROYS_AT_ONCE)

        async def reap(sandbox: Sandbox, reason: str) -> None:
            async with gate:
                await self._destroy(sandbox.sandbox_id, reason)
            log.info("reaped %s sandbox %s (labels %s)", reason, sandbox.sandbox_id, sandbox.labels)

        await asyncio.gather(*(reap(sandbox, reason) for sandbox, reason in doomed))
        return len(doomed)

    async def _reason(self, sandbox: Sandbox, nothing_starting: bool, pool_creates: bool) -> str | None:
        """Why ``sandbox`` is to be reaped (``orphan``, ``store_lost``), or None: it is accounted for.
        A pooled one not in its pool was handed out to a lease, unless it may be one being created."""
        lease_id = sandbox.labels.get(LABEL_LEASE)
        if lease_id and await self.broker.store.exists(lease_id):
            return None  # a lease being created or torn down
        owner = sandbox.labels.get(LABEL_BROKER)
        if owner and owner != self.broker.instance:
            return None if await self.client.exists(keys.broker_instance(owner)) else "orphan"
        lost_at = self.broker.generation.lost_at
        leased_before = lease_id or (sandbox.labels.get(LABEL_POOL) and not pool_creates)
        if leased_before and lost_at is not None and sandbox.created_at < lost_at:
            return "store_lost"  # its lease was recorded in the store that was lost
        young = time.time() - sandbox.created_at < self.settings.create_timeout_s + ORPHAN_GRACE_S
        return None if young and not nothing_starting else "orphan"

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
