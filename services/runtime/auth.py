"""Bearer tokens, shared by every service: token sets from settings, job tokens from Redis.

A token is never kept in plain text by a service: settings accept plain tokens (hashed on
load) or ``sha256:<hex>`` entries (so an operator need not store the token itself), and job
tokens live in Redis only as hashes (``keys.job_tokens``). A set holds several tokens so a new
one can be rolled out before the old one is removed: rotation without downtime. Comparison
is constant time (``hmac.compare_digest`` over every entry of the set).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any, Literal

from redis.asyncio import Redis

from services.protocol import ErrorCode, PlatformError, keys

HASH_PREFIX = "sha256:"
Role = Literal["admin", "service", "job"]


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_secret(prefix: str = "") -> str:
    """A fresh random token (256 bits), e.g. for ``rollout up``."""
    return prefix + secrets.token_urlsafe(32)


def _stored_hash(entry: str) -> str:
    return entry.removeprefix(HASH_PREFIX).lower() if entry.startswith(HASH_PREFIX) else hash_token(entry)


@dataclass(frozen=True, slots=True)
class TokenSet:
    """Hashes of the tokens a role accepts; built from a comma-separated settings value."""

    hashes: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> TokenSet:
        entries = [e.strip() for e in (text or "").split(",") if e.strip()]
        return cls(
            tuple(e.removeprefix(HASH_PREFIX).lower() if e.startswith(HASH_PREFIX) else hash_token(e) for e in entries)
        )

    def matches(self, token: str) -> bool:
        digest = hash_token(token)
        found = False
        for known in self.hashes:  # no early exit: the time does not depend on which entry matched
            found |= hmac.compare_digest(digest, known)
        return found

    def __bool__(self) -> bool:
        return bool(self.hashes)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who called: an operator (admin), a platform service (workers, the API), or one job."""

    role: Role
    job: str | None = None  # the job of a job token

    @property
    def admin(self) -> bool:
        return self.role == "admin"

    def require_admin(self) -> None:
        if self.role != "admin":
            raise PlatformError(ErrorCode.FORBIDDEN, "this route needs the admin token")

    def require_service(self) -> None:
        if self.role == "job":
            raise PlatformError(ErrorCode.FORBIDDEN, "this route needs a service or admin token")

    def sees_job(self, job: str) -> bool:
        return self.role != "job" or self.job == job


ANONYMOUS_ADMIN = Principal("admin")  # only where the operator allowed anonymous access (development)


def bearer(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header; 401 when there is none."""
    if not header or not header[:7].lower() == "bearer " or not header[7:].strip():
        raise PlatformError(ErrorCode.UNAUTHORIZED, "missing bearer token")
    return header[7:].strip()


async def job_of_token(redis: Redis, token: str) -> str | None:
    """The job a job token (minted by the rollout API) belongs to, or None."""
    job: Any = await redis.hget(keys.job_tokens(), hash_token(token))
    if job is None:
        return None
    return job.decode() if isinstance(job, bytes) else str(job)


LEASE_TOKEN_PREFIX = "lease-"  # so the broker looks up only tokens that can be lease tokens


async def mint_lease_token(redis: Redis, lease_id: str, ttl_s: float) -> str:
    """A token that reaches exactly one lease on the broker (exec and files on it, nothing else)
    for at most ``ttl_s``; only its hash is stored. :func:`revoke_lease_token` ends it sooner."""
    token = new_secret(LEASE_TOKEN_PREFIX)
    await redis.set(keys.lease_token(hash_token(token)), lease_id, ex=max(1, int(ttl_s)))
    return token


async def revoke_lease_token(redis: Redis, token: str) -> None:
    await redis.delete(keys.lease_token(hash_token(token)))


async def lease_of_token(redis: Redis, token: str) -> str | None:
    """The lease a lease token is scoped to, or None (not a lease token, expired or revoked)."""
    if not token.startswith(LEASE_TOKEN_PREFIX):
        return None
    lease: Any = await redis.get(keys.lease_token(hash_token(token)))
    if lease is None:
        return None
    return lease.decode() if isinstance(lease, bytes) else str(lease)


@dataclass(frozen=True, slots=True)
class Authenticator:
    """Resolves a bearer header to a :class:`Principal`: admin tokens, service tokens, then job tokens."""

    admin: TokenSet
    service: TokenSet
    anonymous: bool = False  # no header -> admin (development only; never on a shared network)

    async def resolve(self, redis: Redis | None, header: str | None) -> Principal:
        if self.anonymous and not header:
            return ANONYMOUS_ADMIN
        token = bearer(header)
        if self.admin.matches(token):
            return Principal("admin")
        if self.service.matches(token):
            return Principal("service")
        job = await job_of_token(redis, token) if redis is not None else None
        if job is None:
            raise PlatformError(ErrorCode.UNAUTHORIZED, "unknown token")
        return Principal("job", job)
