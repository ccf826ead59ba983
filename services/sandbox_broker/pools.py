"""Warm pools per (template, resources, network): ready sandboxes kept at a target size by a
background refill, cold start when a pool is empty.

Handing out a warm sandbox is a pop from a deque: no process, no I/O. Liveness is checked in the
background (every ``LIVENESS_S``), and the refill target follows demand: at least the template's
``warm_pool``, more when the observed lease rate times the observed create time says the pool
would run dry before a refill lands, or when lease requests that it would serve wait in the
admission queue (one more each: the queue's head finds a warm sandbox when it is admitted), up to
``MAX_GROWTH`` x the target."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from services.protocol.sandboxes import Resources, Template
from services.runtime.tasks import cancel_and_wait
from services.sandbox_broker.backends.base import Backend, Sandbox
from services.sandbox_broker.metrics import BrokerMetrics

log = logging.getLogger(__name__)

REFILL_PARALLEL = 4  # creates in flight per pool
RETRY_S = 2.0  # after a failed create
KEEPALIVE_S = 30.0  # how often pooled sandboxes are told they are still wanted (E2B timeouts)
LIVENESS_S = 5.0  # how often pooled sandboxes are checked in the background
POOL_TTL_S = 300.0
RATE_WINDOW_S = 30.0  # lease rate observed over this window
MAX_GROWTH = 4  # the demand-driven target is at most this many times the configured one


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

    @property
    def resources(self) -> Resources:
        return Resources(cpus=self.cpus, memory_mb=self.memory_mb, disk_mb=self.disk_mb)

    @property
    def label(self) -> str:
        return f"{self.template}/{self.cpus:g}cpu/{self.memory_mb}mb/{self.disk_mb}mb/{self.network}"


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
    def __init__(self, backend: Backend, metrics: BrokerMetrics, create: Create) -> None:
        self.backend = backend
        self.metrics = metrics
        self.create = create
        self._pools: dict[PoolKey, Pool] = {}
        self._lent: set[str] = set()  # taken from a pool, lease not yet recorded
        self._destroying: set[asyncio.Task[None]] = set()
        self._closed = False

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

    def _discard(self, pool: Pool, sandbox: Sandbox) -> None:
        """Drop a dead pooled sandbox and destroy what is left of it in the background."""
        try:
            pool.ready.remove(sandbox)
        except ValueError:
            return  # handed out while the pool was being checked: the lease's now
        self.metrics.pool_dead.labels(pool.key.label).inc()
        self._destroy_later(sandbox)
        self._observe(pool)

    def _destroy_later(self, sandbox: Sandbox) -> None:
        task = asyncio.get_running_loop().create_task(self.backend.destroy(sandbox.sandbox_id))
        self._destroying.add(task)  # keep a reference until it is done
        task.add_done_callback(self._destroying.discard)

    def settled(self, sandbox_id: str) -> None:
        """The sandbox now belongs to a recorded lease (or was destroyed)."""
        self._lent.discard(sandbox_id)

    def owned(self) -> set[str]:
        ids = set(self._lent)
        for pool in self._pools.values():
            ids.update(s.sandbox_id for s in pool.ready)
        return ids

    def creating(self) -> int:
        """Pooled sandboxes being created now (their ids are not known until they are ready)."""
        return sum(p.creating for p in self._pools.values())

    def sizes(self) -> dict[str, int]:
        return {p.key.label: len(p.ready) for p in self._pools.values()}

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
        doomed = [s.sandbox_id for p in self._pools.values() for s in p.ready]
        await asyncio.gather(*(self.backend.destroy(i) for i in doomed), return_exceptions=True)

    async def _refill(self, pool: Pool) -> None:
        last_keepalive = last_check = time.monotonic()
        while not self._closed:
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
                await asyncio.wait_for(pool.wake.wait(), LIVENESS_S)

    async def _check_liveness(self, pool: Pool) -> None:
        for sandbox in list(pool.ready):
            if not await self.backend.alive(sandbox.sandbox_id):
                log.warning("warm pool %s: %s is gone; dropping it", pool.key.label, sandbox.sandbox_id)
                self._discard(pool, sandbox)
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
        pool.ready.append(sandbox)
        self.metrics.pool_refills.labels(pool.key.label).inc()
        self._observe(pool)

    async def _keepalive(self, pool: Pool) -> None:
        for sandbox in list(pool.ready):
            try:
                await self.backend.keepalive(sandbox.sandbox_id, POOL_TTL_S)
            except Exception:
                log.warning("warm pool %s: keepalive of %s failed; dropping it", pool.key.label, sandbox.sandbox_id)
                with contextlib.suppress(ValueError):
                    pool.ready.remove(sandbox)

    def _observe(self, pool: Pool) -> None:
        self.metrics.pool_size.labels(pool.key.label).set(len(pool.ready))
