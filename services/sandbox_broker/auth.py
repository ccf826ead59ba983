"""Who may do what on the broker (docs/security.md).

- admin token: everything, templates included;
- service token (workers, the API): leases of every job, no templates;
- a job's token (minted by the rollout API, checked against Redis): only that job's leases. Another
  job's lease is answered 404, exactly as a lease that does not exist;
- a lease token (minted by a worker for a ``command`` agent, checked against Redis, gone with the
  episode): exec and files on that one lease; another lease is 404, every other route 401.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import redis.asyncio as aioredis
from fastapi import Depends, Request

from services.protocol.errors import PlatformError
from services.protocol.sandboxes import Lease, LeaseRequest
from services.protocol.status import ErrorCode
from services.runtime.auth import LEASE_TOKEN_PREFIX, Authenticator, Principal, TokenSet, lease_of_token
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


KNOWN_CALLERS = 256  # bearer headers of the settings' tokens remembered (a handful in practice)


class Callers:
    """Resolves bearer headers like its :class:`Authenticator`, remembering the answers for the
    settings' own tokens (admin, service): those change only with the settings, so a worker's
    every call need not hash its token and compare it with every entry again. Job tokens are
    looked up in Redis on every call (revoking one takes effect at once); unknown tokens and
    anonymous calls are never remembered. A remembered header is found by a dict lookup (a keyed
    hash, then a comparison only on a hash match), which tells a caller nothing about a token it
    does not hold."""

    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth
        self._known: dict[str, Principal] = {}

    async def resolve(self, redis: aioredis.Redis | None, header: str | None) -> Principal:
        known = self._known.get(header) if header else None
        if known is not None:
            return known
        caller = await self.auth.resolve(redis, header)
        if header and caller.role != "job":
            if len(self._known) >= KNOWN_CALLERS:
                self._known.clear()
            self._known[header] = caller
        return caller


async def caller_of(request: Request) -> Principal:
    return await caller_from(request.app.state, request.headers.get("authorization"))


async def caller_from(state: Any, header: str | None) -> Principal:
    """The caller behind an ``Authorization`` header (``state``: the app's, with ``auth`` and ``redis``)."""
    auth: Authenticator | Callers = state.auth
    client: aioredis.Redis = state.redis
    return await auth.resolve(client, header)


Caller = Annotated[Principal, Depends(caller_of)]


async def lease_scope(request: Request) -> str | None:
    """The one lease the caller's lease token may act on; None for any other caller."""
    return await lease_scope_from(request.app.state, request.headers.get("authorization"))


async def lease_scope_from(state: Any, header: str | None) -> str | None:
    if not header or header[:7].lower() != "bearer ":
        return None
    token = header[7:].strip()
    if not token.startswith(LEASE_TOKEN_PREFIX):  # no Redis read for the other callers
        return None
    client: aioredis.Redis = state.redis
    return await lease_of_token(client, token)


async def lease_access(lease_id: str, caller: Principal, broker: Broker) -> str:
    """The lease id, once the caller may see it (a job token: its own job's leases only)."""
    if caller.role == "job":
        hide_others(caller, await broker.get(lease_id))
    return lease_id


async def sandbox_access(lease_id: str, request: Request, broker: Broker) -> str:
    """Exec and file routes: :func:`lease_access`'s callers, or a lease token on its own lease only
    (another lease is 404, as one that does not exist)."""
    return await sandbox_access_from(lease_id, request.app.state, request.headers.get("authorization"), broker)


async def sandbox_access_from(lease_id: str, state: Any, header: str | None, broker: Broker) -> str:
    scoped = await lease_scope_from(state, header)
    if scoped is None:
        return await lease_access(lease_id, await caller_from(state, header), broker)
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
