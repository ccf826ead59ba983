"""Warm pools per (template, resources, network): ready sandboxes kept at a target size by a
background refill, cold start when a pool is empty.

Handing out a warm sandbox is a pop from a deque: no process, no I/O. Liveness is checked in the
background (every ``LIVENESS_S``), and the refill target follows demand: at least the template's
``warm_pool``, more when the observed lease rate times the observed create time says the pool
would run dry before a refill lands, or when lease requests that it would serve wait in the
admission queue (one more each: the queue's head finds a warm sandbox when it is admitted), up to
``MAX_GROWTH`` x the target.

Each ready sandbox is also on offer to workers, who claim it straight from Redis (``offers.py``,
``protocol/warm_offers.py``). The pool withdraws a sandbox's offer before it hands it out or
destroys it (a withdrawal that finds the offer gone means a worker claimed it: it is that lease's
now), and reads its offer list every ``SYNC_S`` to drop the claimed ones and refill for them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import redis

from services.protocol.sandboxes import LeaseRequest, Resources, Template
from services.protocol.warm_offers import pool_label
from services.runtime.tasks import cancel_and_wait
from services.sandbox_broker.backends.base import Backend, Sandbox
from services.sandbox_broker.metrics import BrokerMetrics
from services.sandbox_broker.offers import Offers

log = logging.getLogger(__name__)

REFILL_PARALLEL = 4  # creates in flight per pool
RETRY_S = 2.0  # after a failed create
KEEPALIVE_S = 30.0  # how often pooled sandboxes are told they are still wanted (E2B timeouts)
LIVENESS_S = 5.0  # how often pooled sandboxes are checked in the background
POOL_TTL_S = 300.0
RATE_WINDOW_S = 30.0  # lease rate observed over this window
MAX_GROWTH = 4  # the demand-driven target is at most this many times the configured one
SYNC_S = 0.1  # how often a pool reads its offer list for sandboxes workers claimed
KEEP_S = 5.0  # how often a pool renews its place among the offerers


@dataclass(frozen=True, slots=True)
class PoolKey:
    template: str
    cpus: float
    memory_mb: int
    disk_mb: int
    network: str = "none"

    @classmethod
    def of(cls, template: str, resources: Resources, network: str = "none") -> PoolKey:
        return cls(template, resources.cpus, resources.memory_mb, resources.disk_mb, network)

    @classmethod
    def serving(cls, template: Template, request: LeaseRequest) -> PoolKey | None:
        """The warm pool a request can be served from (its template's own resources, no network)."""
        same = request.resources == template.resources and request.isolation in (None, template.isolation)
        if request.network == "none" and same:
            return cls.of(template.name, template.resources)
        return None

    @property
    def resources(self) -> Resources:
        return Resources(cpus=self.cpus, memory_mb=self.memory_mb, disk_mb=self.disk_mb)

    @property
    def label(self) -> str:
        return pool_label(self.template, self.resources, self.network)


# creates one pooled sandbox for a pool key
Create = Callable[[PoolKey], Awaitable[Sandbox]]


@dataclass(eq=False)
class Pool:
    key: PoolKey
    target: int  # configured (the template's warm_pool)
    ready: deque[Sandbox] = field(default_factory=deque)
    creating: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    taken_at: deque[float] = field(default_factory=deque)  # monotonic times of recent takes
    create_s: float = 1.0  # moving average of one create
    queued: int = 0  # lease requests of this pool waiting in the admission queue
    synced_at: float = 0.0  # monotonic time its offer list was last read
    kept_at: float = 0.0  # ... and its place among the offerers renewed
    on_offer: set[str] = field(default_factory=set)  # ids of its sandboxes with an offer out (ready or taken)

    def demand(self, now: float) -> int:
        """The size to keep: the configured target, what the observed lease rate needs while a refill
        is on its way (twice the lease rate times the create time), or the target plus the queued
        requests, whichever is larger (at most ``MAX_GROWTH`` x the target)."""
        while self.taken_at and now - self.taken_at[0] > RATE_WINDOW_S:
            self.taken_at.popleft()
        rate = len(self.taken_at) / RATE_WINDOW_S
        needed = max(math.ceil(2 * rate * self.create_s), self.target + self.queued)
        return max(self.target, min(needed, MAX_GROWTH * self.target))


class Pools:
    def __init__(self, backend: Backend, metrics: BrokerMetrics, create: Create, offers: Offers | None = None,
                 waiting: Callable[[], int] = lambda: 0) -> None:  # fmt: skip
        self.backend = backend
        self.metrics = metrics
        self.create = create
        self.offers = offers  # None: the sandboxes are not on offer to workers
        self.waiting = waiting  # lease requests in the admission queue
        self._pools: dict[PoolKey, Pool] = {}
        self._lent: set[str] = set()  # taken from a pool, lease not yet recorded
        self._offered: dict[str, tuple[Pool, str]] = {}  # sandbox id -> its pool and offer text, while on offer
        self._destroying: set[asyncio.Task[None]] = set()
        self._closed = False

    async def start(self) -> None:
        """Before any pool: drop what an earlier run of this replica offered."""
        if self.offers is not None:
            try:
                await self.offers.reset()
            except redis.RedisError as exc:  # its lists expire (LIST_TTL_MS) and its heartbeat is new: logged
                log.warning("could not drop the offers of an earlier run of this replica: %s", exc)

    def ensure(self, template: Template) -> None:
        """Keep ``template.warm_pool`` sandboxes of the template's own resources ready."""
        key = PoolKey.of(template.name, template.resources)
        pool = self._pools.get(key)
        if pool is None:
            if template.warm_pool == 0:
                return
            pool = self._pools[key] = Pool(key, template.warm_pool)
            pool.task = asyncio.get_running_loop().create_task(self._refill(pool), name=f"pool {key.label}")
        pool.target = template.warm_pool
        self.metrics.pool_target.labels(key.label).set(pool.target)
        pool.wake.set()

    def take(self, key: PoolKey) -> Sandbox | None:
        """A pooled sandbox (checked alive in the background), or None (cold start). No I/O."""
        pool = self._pools.get(key)
        if pool is None:
            return None
        pool.taken_at.append(time.monotonic())
        pool.wake.set()
        if not pool.ready:
            self.metrics.pool_misses.labels(key.label).inc()
            return None
        sandbox = pool.ready.popleft()
        self._lent.add(sandbox.sandbox_id)
        self._observe(pool)
        return sandbox

    def offer(self, key: PoolKey, sandbox: Sandbox) -> tuple[str, str] | None:
        """The offer list and text a taken ``sandbox`` is withdrawn by (None: it was not on offer)."""
        offered = self._offered.get(sandbox.sandbox_id)
        return None if offered is None or self.offers is None else (self.offers.list_key(key.label), offered[1])

    async def take_unclaimed(self, key: PoolKey) -> Sandbox | None:
        """:meth:`take`, with the sandbox's offer withdrawn (those workers claimed meanwhile skipped)."""
        while (sandbox := self.take(key)) is not None:
            withdrawn = await self._withdraw(key, sandbox)
            if withdrawn:
                return sandbox
            if withdrawn is False:
                self.claimed(key, sandbox)
            else:  # unknown: left to the orphan sweep, which spares it if a lease holds it
                self._lent.discard(sandbox.sandbox_id)
        return None

    def claimed(self, key: PoolKey, sandbox: Sandbox) -> None:
        """A worker claimed this sandbox (its lease is recorded): no longer the pool's."""
        self._lent.discard(sandbox.sandbox_id)
        self._forget_offer(sandbox.sandbox_id)
        self.metrics.pool_claims.labels(key.label).inc()
        self.hit(key)

    async def _withdraw(self, key: PoolKey, sandbox: Sandbox) -> bool | None:
        """Take the sandbox's offer back: True (or it was not on offer), False where a worker claimed
        it, None where Redis did not say (the sandbox is then not used: a claim may hold it)."""
        text = self._forget_offer(sandbox.sandbox_id)
        if text is None or self.offers is None:
            return True
        try:
            return await self.offers.withdraw(key.label, text)
        except redis.RedisError as exc:
            log.warning("warm pool %s: could not withdraw the offer of %s (%s); not using it", key.label,
                        sandbox.sandbox_id, exc)  # fmt: skip
            return None

    def ready(self, key: PoolKey) -> int:
        """Sandboxes of the pool ready to hand out now."""
        pool = self._pools.get(key)
        return len(pool.ready) if pool is not None else 0

    @contextlib.contextmanager
    def queued(self, key: PoolKey | None) -> Iterator[None]:
        """A lease request this pool would serve waits in the admission queue for the block."""
        pool = self._pools.get(key) if key is not None else None
        if pool is None:
            yield
            return
        pool.queued += 1
        pool.wake.set()
        try:
            yield
        finally:
            pool.queued -= 1

    def hit(self, key: PoolKey) -> None:
        """A lease was recorded with a sandbox of this pool."""
        self.metrics.pool_hits.labels(key.label).inc()

    def give_back(self, key: PoolKey, sandbox: Sandbox) -> None:
        """A taken sandbox that no lease got (the limits refused it): first in line again."""
        self._lent.discard(sandbox.sandbox_id)
        pool = self._pools.get(key)
        if pool is None or self._closed:
            self._destroy_later(sandbox)
            return
        pool.ready.appendleft(sandbox)
        self._observe(pool)

    async def _discard(self, pool: Pool, sandbox: Sandbox) -> None:
        """Drop a dead pooled sandbox and destroy what is left of it in the background (unless a
        worker claimed it meanwhile: then its lease fails on it, as any lease on a dead sandbox)."""
        try:
            pool.ready.remove(sandbox)
        except ValueError:
            return  # handed out while the pool was being checked: the lease's now
        self._observe(pool)
        withdrawn = await self._withdraw(pool.key, sandbox)
        if withdrawn is False:
            self.claimed(pool.key, sandbox)
            return
        self.metrics.pool_dead.labels(pool.key.label).inc()
        if withdrawn:
            self._destroy_later(sandbox)

    def _destroy_later(self, sandbox: Sandbox) -> None:
        task = asyncio.get_running_loop().create_task(self.backend.destroy(sandbox.sandbox_id))
        self._destroying.add(task)  # keep a reference until it is done
        task.add_done_callback(self._destroying.discard)

    def settled(self, sandbox_id: str) -> None:
        """The sandbox now belongs to a recorded lease (or was destroyed); its offer was withdrawn."""
        self._lent.discard(sandbox_id)
        self._forget_offer(sandbox_id)

    def _forget_offer(self, sandbox_id: str) -> str | None:
        """The sandbox's offer text, no longer tracked (withdrawn, claimed, or in a lease's script)."""
        offered = self._offered.pop(sandbox_id, None)
        if offered is None:
            return None
        offered[0].on_offer.discard(sandbox_id)
        return offered[1]

    def owned(self) -> set[str]:
        ids = set(self._lent) | self._offered.keys()  # offered: also one whose offer is on its way
        for pool in self._pools.values():
            ids.update(s.sandbox_id for s in pool.ready)
        return ids

    def creating(self) -> int:
        """Pooled sandboxes being created now (their ids are not known until they are ready)."""
        return sum(p.creating for p in self._pools.values())

    def sizes(self) -> dict[str, int]:
        return {p.key.label: len(p.ready) for p in self._pools.values()}

    async def current_sizes(self) -> dict[str, int]:
        """:meth:`sizes` with the claims made since the last sync taken off (``/healthz``: a pool read
        as full has that many sandboxes no worker has claimed)."""
        if self.offers is not None:
            for pool in list(self._pools.values()):
                await self._sync(pool)
        return self.sizes()

    async def close(self, timeout_s: float = 60.0) -> None:
        """Stop refilling and destroy the pooled sandboxes. Creates in flight are waited for (a create
        cancelled half-way could leave a sandbox nobody knows about) up to ``timeout_s``."""
        self._closed = True
        tasks = [p.task for p in self._pools.values() if p.task is not None]
        for pool in self._pools.values():
            pool.wake.set()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            for task in pending:
                await cancel_and_wait(task)
        pooled = [(p.key, s) for p in self._pools.values() for s in p.ready]
        withdrawn = await asyncio.gather(*(self._withdraw(k, s) for k, s in pooled))
        doomed = [s.sandbox_id for (_, s), gone in zip(pooled, withdrawn, strict=True) if gone]  # not claimed
        await asyncio.gather(*(self.backend.destroy(i) for i in doomed), return_exceptions=True)

    async def _refill(self, pool: Pool) -> None:
        last_keepalive = last_check = time.monotonic()
        while not self._closed:
            if self.offers is not None and time.monotonic() - pool.synced_at >= SYNC_S:
                await self._sync(pool)
            missing = pool.demand(time.monotonic()) - len(pool.ready) - pool.creating
            if missing > 0:
                await asyncio.gather(*(self._add(pool) for _ in range(min(missing, REFILL_PARALLEL))))
                continue
            now = time.monotonic()
            if now - last_check > LIVENESS_S:
                last_check = now
                await self._check_liveness(pool)
            if now - last_keepalive > KEEPALIVE_S:
                last_keepalive = now
                await self._keepalive(pool)
            pool.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(pool.wake.wait(), SYNC_S if self.offers is not None else LIVENESS_S)

    async def _check_liveness(self, pool: Pool) -> None:
        for sandbox in list(pool.ready):
            if not await self.backend.alive(sandbox.sandbox_id):
                log.warning("warm pool %s: %s is gone; dropping it", pool.key.label, sandbox.sandbox_id)
                await self._discard(pool, sandbox)
            await asyncio.sleep(0)  # a local check is a few stat calls: let requests in between, not after hundreds

    async def _add(self, pool: Pool) -> None:
        pool.creating += 1
        started = time.monotonic()
        try:
            sandbox = await self.create(pool.key)
            pool.create_s = 0.8 * pool.create_s + 0.2 * (time.monotonic() - started)
        except Exception:
            log.exception("warm pool %s: create failed; retrying in %.0fs", pool.key.label, RETRY_S)
            await asyncio.sleep(RETRY_S)
            return
        finally:
            pool.creating -= 1
        if self._closed or len(pool.ready) >= pool.demand(time.monotonic()):
            await self.backend.destroy(sandbox.sandbox_id)
            return
        await self._offer(pool, [sandbox])  # on offer before it counts as ready (``/healthz``, the metrics)
        pool.ready.append(sandbox)
        self.metrics.pool_refills.labels(pool.key.label).inc()
        self._observe(pool)

    async def _offer(self, pool: Pool, sandboxes: list[Sandbox]) -> None:
        """Put ready sandboxes on offer to workers. Each is known as offered before the push goes out,
        so the broker withdraws it before any use, whatever became of the push: where the push failed,
        the withdrawal finds nothing and the sandbox is left to the orphan sweep (unused, and
        destroyed unless a lease holds it)."""
        if self.offers is None:
            return
        texts = [self.offers.describe(pool.key.template, sandbox).encode() for sandbox in sandboxes]
        for sandbox, text in zip(sandboxes, texts, strict=True):
            self._offered[sandbox.sandbox_id] = (pool, text)
            pool.on_offer.add(sandbox.sandbox_id)
        try:
            await self.offers.push(pool.key.label, texts)
        except redis.RedisError as exc:
            log.warning("warm pool %s: could not offer %d sandboxes to workers: %s", pool.key.label, len(texts), exc)

    async def _sync(self, pool: Pool) -> None:
        """Drop the pooled sandboxes workers claimed (their offers are gone from the list) and tell
        claimers whether requests wait in the admission queue."""
        assert self.offers is not None
        now = time.monotonic()
        pool.synced_at = now
        label = pool.key.label
        try:
            await self.offers.waiting(self.waiting() > 0)
            if now - pool.kept_at >= KEEP_S:
                pool.kept_at = now
                await self.offers.keep(label)
            if pool.on_offer and await self.offers.length(label) < len(pool.on_offer):
                still = await self.offers.still_offered(label)
                offered = [s for s in pool.ready if s.sandbox_id in pool.on_offer]
                for sandbox in [s for s in offered if self._offered[s.sandbox_id][1] not in still]:
                    if sandbox in pool.ready:  # not taken by the broker meanwhile (its withdrawal tells it)
                        pool.ready.remove(sandbox)
                        pool.taken_at.append(now)
                        self.claimed(pool.key, sandbox)
                self._observe(pool)
                pool.wake.set()
        except redis.RedisError as exc:
            log.warning("warm pool %s: could not read its offers: %s", label, exc)

    async def _keepalive(self, pool: Pool) -> None:
        for sandbox in list(pool.ready):
            try:
                await self.backend.keepalive(sandbox.sandbox_id, POOL_TTL_S)
            except Exception:
                log.warning("warm pool %s: keepalive of %s failed; dropping it", pool.key.label, sandbox.sandbox_id)
                with contextlib.suppress(ValueError):
                    pool.ready.remove(sandbox)
                    if await self._withdraw(pool.key, sandbox) is False:
                        self.claimed(pool.key, sandbox)

    def _observe(self, pool: Pool) -> None:
        self.metrics.pool_size.labels(pool.key.label).set(len(pool.ready))
