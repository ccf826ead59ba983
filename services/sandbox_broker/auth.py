"""Who may do what on the broker (docs/security.md).

- admin token: everything, templates included;
- service token (workers, the API): leases of every job, no templates;
- a job's token (minted by the rollout API, checked against Redis): only that job's leases. Another
  job's lease is answered 404, exactly as a lease that does not exist;
- a lease token (minted by a worker for a ``command`` agent, checked against Redis, gone with the
  episode): exec and files on that one lease; another lease is 404, every other route 401.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import redis.asyncio as aioredis
from fastapi import Depends, Request

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import Lease, LeaseRequest
from services.protocol.status import ErrorCode
from services.runtime.auth import Authenticator, Principal, TokenSet, lease_of_token
from services.sandbox_broker.settings import BrokerSettings

if TYPE_CHECKING:
    from services.sandbox_broker.broker import Broker


def authenticator(settings: BrokerSettings) -> Authenticator:
    admin, service = TokenSet.parse(settings.admin_token), TokenSet.parse(settings.service_token)
    if not (admin or service or settings.allow_anonymous):
        raise ValueError(
            "the broker has no tokens: set ROLLOUT_ADMIN_TOKEN and ROLLOUT_SERVICE_TOKEN (or ROLLOUT_BROKER_...) "
            "(or ROLLOUT_BROKER_ALLOW_ANONYMOUS=true on a development machine)"
        )
    return Authenticator(admin, service, settings.allow_anonymous)


async def caller_of(request: Request) -> Principal:
    auth: Authenticator = request.app.state.auth
    client: aioredis.Redis = request.app.state.redis
    return await auth.resolve(client, request.headers.get("authorization"))


Caller = Annotated[Principal, Depends(caller_of)]


async def lease_scope(request: Request) -> str | None:
    """The one lease the caller's lease token may act on; None for any other caller."""
    header = request.headers.get("authorization") or ""
    if header[:7].lower() != "bearer ":
        return None
    client: aioredis.Redis = request.app.state.redis
    return await lease_of_token(client, header[7:].strip())


async def lease_access(lease_id: str, caller: Principal, broker: Broker) -> str:
    """The lease id, once the caller may see it (a job token: its own job's leases only)."""
    if caller.role == "job":
        hide_others(caller, await broker.get(lease_id))
    return lease_id


async def sandbox_access(lease_id: str, request: Request, broker: Broker) -> str:
    """Exec and file routes: :func:`lease_access`'s callers, or a lease token on its own lease only
    (another lease is 404, as one that does not exist)."""
    scoped = await lease_scope(request)
    if scoped is None:
        return await lease_access(lease_id, await caller_of(request), broker)
    if scoped != lease_id:
        raise PlatformError(ErrorCode.LEASE_NOT_FOUND, f"no lease {lease_id!r}")
    return lease_id


def hide_others(caller: Principal, lease: Lease) -> Lease:
    """404 for a lease of another job: a job cannot even learn that it exists."""
    if not caller.sees_job(lease.job):
        raise PlatformError(ErrorCode.LEASE_NOT_FOUND, f"no lease {lease.id!r}")
    return lease


def own_request(caller: Principal, request: LeaseRequest) -> LeaseRequest:
    """A job token leases for its own job only (the body's job must be it, or be left out)."""
    if caller.role != "job" or caller.job == request.job:
        return request
    if "job" in request.model_fields_set:
        raise PlatformError(ErrorCode.FORBIDDEN, f"this token does not belong to job {request.job!r}")
    return request.model_copy(update={"job": caller.job})


def listed_job(caller: Principal, job: str | None) -> str | None:
    if caller.role != "job" or job in (None, caller.job):
        return caller.job if caller.role == "job" else job
    raise PlatformError(ErrorCode.FORBIDDEN, f"this token does not belong to job {job!r}")
