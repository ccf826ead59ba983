"""Starting a lease's sandbox and recording it live: backend creates under the create rate and the
create timeout (cold leases and the warm pools' refills), and the wait through a lease store outage
when a ready lease goes live."""

from __future__ import annotations

import asyncio
import logging
import time

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import Lease, LeaseRequest, Template
from services.protocol.status import ErrorCode
from services.runtime.outages import STORE_ERRORS, Outage
from services.sandbox_broker.admission import TokenBucket
from services.sandbox_broker.backends.base import (
    LABEL_BROKER,
    LABEL_JOB,
    LABEL_LEASE,
    LABEL_POOL,
    LABEL_TEMPLATE,
    Backend,
    Sandbox,
    SandboxSpec,
)
from services.sandbox_broker.forks import SetUp, TemplateSetups
from services.sandbox_broker.leases import LeaseRecord, LeaseStore
from services.sandbox_broker.metrics import BrokerMetrics
from services.sandbox_broker.pools import PoolKey
from services.sandbox_broker.settings import BrokerSettings
from services.sandbox_broker.templates import Templates

log = logging.getLogger(__name__)
ACTIVATE_RETRY_S = 0.2  # between tries to record a ready lease live while Redis is away


class SandboxStarts:
    def __init__(
        self,
        settings: BrokerSettings,
        backend: Backend,
        store: LeaseStore,
        templates: Templates,
        metrics: BrokerMetrics,
        instance: str,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.store = store
        self.templates = templates
        self.metrics = metrics
        self.instance = instance
        self.bucket = TokenBucket(settings.create_rate, settings.create_burst)
        self.template_setups = TemplateSetups(backend, settings.shared_setup_ttl_s)  # each template's, once
        self._activating = Outage("Redis (leases going live)", log)  # one line per outage, not per lease

    def record(self, lease_id: str, template: Template, request: LeaseRequest, sandbox: Sandbox, warm: bool,
               setup: SetUp | None, started: float) -> LeaseRecord:  # fmt: skip
        """The record of a lease on ``sandbox``, as it goes live (``started``: when its request came)."""
        lease = Lease(
            id=lease_id, template=template.name, backend=self.backend.name, job=request.job,
            sandbox_id=sandbox.sandbox_id, expires_at=time.time() + request.ttl_s, warm=warm,
            start_s=time.monotonic() - started, workdir=sandbox.workdir, labels=request.labels,
            setup_s=setup.setup_s if setup else 0.0, setup_shared=setup.shared if setup else False,
        )  # fmt: skip
        return LeaseRecord(lease, request.network, self.instance)

    async def activate(self, record: LeaseRecord) -> bool:
        """Record the lease live. Redis away (a restart, a failover) is waited out until the create
        timeout: the sandbox is ready, and failing here would leave the lease reserved until its
        create deadline and cost the caller an attempt. The script is idempotent (a reply lost after
        it ran answers the same the second time)."""
        deadline = time.monotonic() + self.settings.create_timeout_s
        while True:
            try:
                activated = await self.store.activate(record)
            except STORE_ERRORS as exc:
                self._activating.failed(exc)
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(ACTIVATE_RETRY_S)
                continue
            self._activating.ok()
            return activated

    async def cold(
        self, lease_id: str, template: Template, request: LeaseRequest, clone_of: str | None = None
    ) -> Sandbox:
        """A new sandbox for the lease (a clone of ``clone_of`` when given), within the request's wait."""
        labels = {LABEL_BROKER: self.instance, LABEL_LEASE: lease_id, LABEL_JOB: request.job,
                  LABEL_TEMPLATE: template.name}  # fmt: skip
        spec = SandboxSpec(template, request.resources, request.network, labels, clone_of, request.isolation)
        deadline = time.monotonic() + request.wait_s
        return await self.create(spec, deadline)

    async def pooled(self, key: PoolKey) -> Sandbox:
        """A sandbox for a warm pool."""
        template = await self.templates.get(key.template)
        labels = {LABEL_BROKER: self.instance, LABEL_POOL: "1", LABEL_TEMPLATE: template.name}
        return await self.create(SandboxSpec(template, key.resources, "none", labels))

    async def create(self, spec: SandboxSpec, rate_deadline: float | None = None) -> Sandbox:
        """A backend create under the rate limit and the create timeout, failures classified."""
        await self.bucket.acquire(rate_deadline)
        started = time.monotonic()
        try:
            creating = self.template_setups.create(spec, self.backend.create)
            sandbox, setup = await asyncio.wait_for(creating, self.settings.create_timeout_s)
        except PlatformError:
            raise
        except TimeoutError:
            message = f"sandbox not ready within {self.settings.create_timeout_s:.0f}s"
            raise PlatformError(ErrorCode.SANDBOX_CREATE_FAILED, message) from None
        except Exception as exc:
            log.exception("sandbox create failed on %s", self.backend.name)
            raise PlatformError(ErrorCode.SANDBOX_CREATE_FAILED, f"sandbox create failed: {exc}") from exc
        self.metrics.sandbox_create.labels(self.backend.name).observe(time.monotonic() - started)
        if setup is not None:
            self.metrics.template_setups.labels(setup).inc()
        return sandbox
