"""The broker's operations on leases, independent of HTTP: create (admission, warm pool or cold
start: the sandbox creates and the wait to record a lease live are ``starts.py``), exec, files,
renew, release."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import (
    ExecRequest,
    ExecResult,
    GatewayBinding,
    Lease,
    LeaseRequest,
    RenewedLeases,
    Template,
)
from services.protocol.status import ErrorCode
from services.runtime.generation import StoreGeneration
from services.sandbox_broker.admission import Admission
from services.sandbox_broker.backends.base import Backend, GatewayBinder, OutputSink, Sandbox, TaskRouter, no_gateway
from services.sandbox_broker.forks import SetUp, SharedSetups
from services.sandbox_broker.lease_cache import LeaseCache
from services.sandbox_broker.leases import LeaseRecord, LeaseStore
from services.sandbox_broker.metrics import BrokerMetrics
from services.sandbox_broker.offers import Offers
from services.sandbox_broker.pools import PoolKey, Pools
from services.sandbox_broker.settings import BrokerSettings
from services.sandbox_broker.starts import SandboxStarts
from services.sandbox_broker.templates import Templates

log = logging.getLogger(__name__)
T = TypeVar("T")


class Broker:
    def __init__(
        self,
        settings: BrokerSettings,
        backend: Backend,
        store: LeaseStore,
        templates: Templates,
        metrics: BrokerMetrics,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.store = store
        self.templates = templates
        self.metrics = metrics
        self.instance = settings.instance_name()
        self.starts = SandboxStarts(settings, backend, store, templates, metrics, self.instance)
        self.admission = Admission()  # the pools offer sandboxes to workers too (claimed straight from Redis)
        self.pools = Pools(backend, metrics, self.starts.pooled, self._offers(), lambda: self.admission.waiting)
        self.capabilities: dict[str, Any] = {}
        self.setups = SharedSetups(backend, settings.shared_setup_ttl_s)
        self.cache = LeaseCache(store.client)
        self.generation = StoreGeneration("broker")  # followed by the reaper (reaper.py)
        self._quiet = False
        # the labelled series of the hot paths, looked up once (``labels()`` is a locked dict lookup)
        self._exec_latency = metrics.exec_latency.labels(backend.name)
        self._command_cpu = metrics.command_cpu.labels(backend.name)
        self._lease_start = {warm: metrics.lease_start.labels(backend.name, "warm" if warm else "cold")
                             for warm in (True, False)}  # fmt: skip

    async def start(self) -> None:
        self.capabilities = await self.backend.start()
        quota = str(self.capabilities.get("disk_quota", "none"))  # local, docker; e2b: its template sets the disk
        self.metrics.disk_quota.set(0 if quota.startswith("none") else 1)
        self.metrics.lease_limit.set(self.settings.max_leases)
        await self.pools.start()
        self.cache.start()

    def start_pools(self, templates: list[Template]) -> None:
        for template in templates:
            self.pools.ensure(template)

    async def quiesce(self) -> None:
        """Stop everything that starts sandboxes (the pools' creates in flight are waited for, their
        sandboxes destroyed): what is left on the backend after this is leased or nobody's."""
        if self._quiet:
            return
        self._quiet = True
        await self.cache.close()
        await self.admission.close()
        await self.pools.close(self.settings.create_timeout_s)
        await self.setups.close()
        await self.starts.template_setups.close()

    async def close(self) -> None:
        await self.quiesce()
        await self.backend.close()

    # -- leases --------------------------------------------------------------------------------

    async def create_lease(self, request: LeaseRequest) -> Lease:
        started = time.monotonic()
        template = await self.templates.get(request.template)
        self.check_isolation(request.isolation or template.isolation)
        lease_id = "lse-" + secrets.token_hex(12)
        warm = await self._warm_lease(lease_id, template, request, started)
        if warm is not None:
            return warm
        with self.pools.queued(PoolKey.serving(template, request)):  # its pool refills for it meanwhile
            await self._admit(lease_id, request)
        self.metrics.lease_wait.observe(time.monotonic() - started)
        try:
            sandbox, warm_hit, setup = await self._set_up_sandbox(lease_id, template, request)
        except BaseException:
            await self._abandon(lease_id)
            raise
        record = self.starts.record(lease_id, template, request, sandbox, warm_hit, setup, started)
        epoch = self.cache.epoch
        try:
            activated = await self.starts.activate(record)
        finally:
            self.pools.settled(sandbox.sandbox_id)
        if not activated:
            await self.backend.destroy(sandbox.sandbox_id)
            raise PlatformError(ErrorCode.CONFLICT, f"lease {lease_id} was released while starting")
        return await self._handed_out(record, template, epoch)

    async def warm_lease(self, request: LeaseRequest) -> Lease | None:
        """A lease from a warm pool only, made as :meth:`create_lease`'s warm path makes it. None, with
        nothing taken or reserved, where that path would not serve it now (no warm sandbox ready, others
        waiting for capacity, the limits full): ``POST /leases`` then makes it, queued as any other."""
        started = time.monotonic()
        template = await self.templates.get(request.template)
        self.check_isolation(request.isolation or template.isolation)
        key = PoolKey.serving(template, request)
        if key is None or not self.pools.ready(key):  # no take: the pool's miss is counted by POST /leases
            return None
        return await self._warm_lease("lse-" + secrets.token_hex(12), template, request, started)

    async def _warm_lease(self, lease_id: str, template: Template, request: LeaseRequest,
                          started: float) -> Lease | None:  # fmt: skip
        """The warm path: a pooled sandbox, admitted and recorded in one Redis round trip. None (the
        request takes the queue and the cold path) when others wait for capacity, the pool is empty, or
        the limits refuse it (the sandbox goes back to its pool)."""
        key = PoolKey.serving(template, request)
        if key is None or request.setup is not None or self.admission.waiting:
            return None
        while (sandbox := self.pools.take(key)) is not None:
            record = self.starts.record(lease_id, template, request, sandbox, True, None, started)
            epoch = self.cache.epoch
            try:
                refused = await self.store.reserve_live(record, self._limits(), self.pools.offer(key, sandbox))
            except BaseException:
                self.pools.settled(sandbox.sandbox_id)  # the script may have run: never pooled again (the reaper's)
                raise
            if refused == 4:  # a worker claimed it from Redis first (the sandbox is that lease's): the next one
                self.pools.claimed(key, sandbox)
                continue
            if refused:
                self.pools.give_back(key, sandbox)
                return None
            self.pools.settled(sandbox.sandbox_id)
            self.metrics.lease_wait.observe(time.monotonic() - started)
            return await self._handed_out(record, template, epoch)
        return None

    async def _handed_out(self, record: LeaseRecord, template: Template, epoch: int) -> Lease:
        lease = record.lease
        self.cache.put(record, epoch)
        await self.backend.keepalive(lease.sandbox_id, lease.expires_at - time.time() + self.settings.ttl_grace_s)
        self._lease_start[lease.warm].observe(lease.start_s)
        if lease.warm:
            self.pools.hit(PoolKey.of(template.name, template.resources))
        return lease

    def check_isolation(self, level: str | None) -> None:
        """422 ``validation_error`` naming ``isolation`` when this broker's backend cannot give that level."""
        if level is None:
            return
        levels: dict[str, str] = self.capabilities.get("isolation_levels", {})  # level -> "" or why not
        if level not in levels:
            raise PlatformError(ErrorCode.VALIDATION_ERROR, f"the {self.backend.name} backend has no isolation "
                                f"{level!r} (it has: {', '.join(sorted(levels)) or 'none to choose'})",
                                field="isolation")  # fmt: skip
        if levels[level]:
            raise PlatformError(ErrorCode.VALIDATION_ERROR, f"isolation {level!r} is unavailable on this broker's "
                                f"host: {levels[level]}", field="isolation")  # fmt: skip

    def _limits(self) -> tuple[int, int, int]:
        return self.settings.max_leases, self.settings.max_backend_leases, self.settings.job_quota

    def _offers(self) -> Offers | None:
        settings = self.settings
        return Offers(self.store, self.instance, self._limits(), self.backend.name) if settings.warm_offers else None

    async def _admit(self, lease_id: str, request: LeaseRequest) -> None:
        deadline = time.time() + request.wait_s + self.settings.create_timeout_s

        async def reserve() -> int:
            return await self.store.reserve(lease_id, job=request.job, backend=self.backend.name, owner=self.instance,
                                            deadline=deadline, limits=self._limits())  # fmt: skip

        self.metrics.queue.set(self.admission.waiting)
        try:
            await self.admission.admit(request.job, reserve, request.wait_s)
        finally:
            self.metrics.queue.set(self.admission.waiting)

    async def _set_up_sandbox(
        self, lease_id: str, template: Template, request: LeaseRequest
    ) -> tuple[Sandbox, bool, SetUp | None]:
        """The lease's sandbox (warm or cold) with the request's setup done: once per setup key, shared."""
        if request.setup is None:
            return *(await self._sandbox_for(lease_id, template, request)), None
        warm = False

        async def create(clone_of: str | None) -> Sandbox:
            nonlocal warm
            if clone_of is not None:
                return await self.starts.cold(lease_id, template, request, clone_of)
            sandbox, warm = await self._sandbox_for(lease_id, template, request)
            return sandbox

        setup = await self.setups.sandbox_for(request, create)
        return setup.sandbox, warm, setup

    async def _sandbox_for(self, lease_id: str, template: Template, request: LeaseRequest) -> tuple[Sandbox, bool]:
        key = PoolKey.serving(template, request)
        pooled = await self.pools.take_unclaimed(key) if key is not None else None
        if pooled is not None:
            return pooled, True
        return await self.starts.cold(lease_id, template, request), False

    async def _abandon(self, lease_id: str) -> None:
        if await self.store.claim(lease_id) is not False:
            await self.store.forget(lease_id)
        self.admission.poke()

    async def get(self, lease_id: str) -> Lease:
        return (await self.live(lease_id)).lease

    async def live(self, lease_id: str) -> LeaseRecord:
        """The lease's record (from this process's cache when it may be trusted: ``lease_cache.py``)."""
        now = time.time()
        record = self.cache.get(lease_id, now)
        if record is not None:
            self.metrics.lease_cache_hits.inc()
            return record
        epoch = self.cache.epoch
        record = await self.store.get(lease_id)
        if record is None or record.lease.expires_at < now:
            raise PlatformError(ErrorCode.LEASE_NOT_FOUND, f"no live lease {lease_id}")
        self.cache.put(record, epoch)
        return record

    async def renew(self, lease_id: str, ttl_s: float) -> Lease:
        record = await self.live(lease_id)
        lease = record.lease.model_copy(update={"expires_at": time.time() + ttl_s})
        epoch = self.cache.epoch
        if not await self.store.renew(lease):
            raise PlatformError(ErrorCode.LEASE_NOT_FOUND, f"lease {lease_id} ended")
        self.cache.put(dataclasses.replace(record, lease=lease), epoch)
        await self.backend.keepalive(lease.sandbox_id, ttl_s + self.settings.ttl_grace_s)
        return lease

    async def renew_many(self, lease_ids: list[str], ttl_s: float, visible: Callable[[Lease], bool]) -> RenewedLeases:
        """Renew every lease of ``lease_ids`` that is live and ``visible`` to the caller: one Redis
        script for all of them (and one pipeline for the records not cached here). The rest are
        answered ``ended``, as a renewal alone would answer 404."""
        asked = list(dict.fromkeys(lease_ids))
        found = await self._live_many(asked)
        shown = [found[i] for i in asked if i in found and visible(found[i].lease)]
        expires_at = time.time() + ttl_s
        leases = [record.lease.model_copy(update={"expires_at": expires_at}) for record in shown]
        epoch = self.cache.epoch
        renewed = []
        for record, lease, ok in zip(shown, leases, await self.store.renew_many(leases), strict=True):
            if ok:
                self.cache.put(dataclasses.replace(record, lease=lease), epoch)
                renewed.append(lease)
        kept = await asyncio.gather(*(self._keepalive(lease, ttl_s) for lease in renewed))
        done = {lease.id: lease.expires_at for lease, ok in zip(renewed, kept, strict=True) if ok}
        return RenewedLeases(expires_at=done, ended=[i for i in asked if i not in done])

    async def _keepalive(self, lease: Lease, ttl_s: float) -> bool:
        try:
            await self.backend.keepalive(lease.sandbox_id, ttl_s + self.settings.ttl_grace_s)
            return True
        except Exception as exc:  # the lease is not renewed where its sandbox cannot be (E2B's timeout)
            log.warning("keepalive of %s (lease %s) failed: %r", lease.sandbox_id, lease.id, exc)
            return False

    async def _live_many(self, lease_ids: list[str]) -> dict[str, LeaseRecord]:
        """:meth:`live` of each lease that is live, by id: the uncached ones read in one pipeline."""
        now = time.time()
        found: dict[str, LeaseRecord] = {}
        missing = []
        for lease_id in lease_ids:
            record = self.cache.get(lease_id, now)
            if record is None:
                missing.append(lease_id)
            else:
                found[lease_id] = record
        self.metrics.lease_cache_hits.inc(len(found))
        epoch = self.cache.epoch
        for lease_id, record in zip(missing, await self.store.get_many(missing), strict=True):
            if record is not None and record.lease.expires_at >= now:
                self.cache.put(record, epoch)
                found[lease_id] = record
        return found

    async def release(self, lease_id: str) -> bool:
        """Destroy the lease's sandbox; False when it was already gone (release is idempotent)."""
        claimed = await self.store.claim(lease_id)
        self.cache.drop(lease_id)  # every replica drops it on the claim's announcement; this one at once
        if claimed is False:
            return False
        try:
            if isinstance(claimed, LeaseRecord):
                await self.backend.destroy(claimed.lease.sandbox_id)
        finally:
            await self.store.forget(lease_id)
            self.admission.poke()
        return True

    async def list(self, job: str | None) -> list[Lease]:
        return await self.store.list(job)

    # -- commands and files --------------------------------------------------------------------

    async def exec(self, lease_id: str, request: ExecRequest, sink: OutputSink | None = None) -> ExecResult:
        started = time.monotonic()
        if (request.argv is None) == (request.shell is None):
            raise PlatformError(ErrorCode.VALIDATION_ERROR, "give exactly one of argv and shell", field="argv")
        if request.argv is not None and not request.argv:
            raise PlatformError(ErrorCode.VALIDATION_ERROR, "argv is empty", field="argv")
        if request.gateway_port is not None and not isinstance(self.backend, GatewayBinder):
            raise no_gateway(self.backend.name)
        record = await self.live(lease_id)
        result = await self._backend_call(self.backend.exec(record.lease.sandbox_id, request, sink))
        result.broker_s = time.monotonic() - started
        self._exec_latency.observe(result.broker_s)
        self._command_cpu.inc(result.cpu_s or 0.0)  # None: the backend does not measure it
        return result

    async def bind_gateway(self, lease_id: str, binding: GatewayBinding) -> None:
        """Forward the lease's gateway session into its sandbox (its agent runs there)."""
        if not isinstance(self.backend, GatewayBinder):
            raise no_gateway(self.backend.name)
        record = await self.live(lease_id)
        sandbox_id = record.lease.sandbox_id
        if binding.task_lease is not None:
            await self._check_task(record.lease.job, binding.task_lease)
        bind = self.backend.bind_gateway(sandbox_id, binding.session, binding.upstream, binding.ttl_s)
        await self._backend_call(bind)
        if binding.task_lease is not None and binding.broker is not None:
            assert isinstance(self.backend, TaskRouter)
            self.backend.route_task(sandbox_id, binding.task_lease, binding.broker)

    async def _check_task(self, job: str, task_lease: str) -> None:
        """A paired agent's sandbox reaches a task lease of its own job, on a backend that can relay it."""
        if not isinstance(self.backend, TaskRouter):
            why = f"the {self.backend.name} backend relays no task lease into an agent's sandbox (local and docker do)"
            raise PlatformError(ErrorCode.BAD_REQUEST, why, field="task_lease")
        task = await self.live(task_lease)
        if task.lease.job != job:
            raise PlatformError(ErrorCode.BAD_REQUEST, "the task lease is of another job", field="task_lease")

    async def write_file(self, lease_id: str, path: str, data: bytes) -> None:
        record = await self.live(lease_id)
        await self._backend_call(self.backend.write_file(record.lease.sandbox_id, path, data))

    async def read_file(self, lease_id: str, path: str) -> bytes:
        record = await self.live(lease_id)
        return await self._backend_call(self.backend.read_file(record.lease.sandbox_id, path))

    async def put_archive(self, lease_id: str, directory: str, tar: bytes) -> None:
        record = await self.live(lease_id)
        await self._backend_call(self.backend.put_archive(record.lease.sandbox_id, directory, tar))

    async def get_archive(self, lease_id: str, directory: str) -> bytes:
        record = await self.live(lease_id)
        return await self._backend_call(self.backend.get_archive(record.lease.sandbox_id, directory))

    async def _backend_call(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except PlatformError:
            raise
        except (OSError, ConnectionError, TimeoutError) as exc:
            log.exception("%s backend call failed", self.backend.name)
            message = f"{self.backend.name} backend: {type(exc).__name__}"  # details (host paths) only in the log
            raise PlatformError(ErrorCode.TRANSPORT_ERROR, message) from exc
