"""Bearer tokens: the admin token (settings) creates jobs; a job token reaches only its own job.

Job tokens are stored as SHA-256 hashes (``keys.job_tokens``); the plain token is shown once.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from services.protocol import ErrorCode, PlatformError
from services.runtime.auth import TokenSet, bearer, hash_token, job_of_token, new_secret

__all__ = ["Caller", "hash_token", "new_token", "resolve_caller"]


@dataclass(frozen=True, slots=True)
class Caller:
    admin: bool
    job: str | None  # the job a job token belongs to; None for the admin

    def require_admin(self) -> None:
        if not self.admin:
            raise PlatformError(ErrorCode.FORBIDDEN, "this route needs the admin token")

    def require_job(self, job: str) -> None:
        if not self.admin and self.job != job:
            raise PlatformError(ErrorCode.FORBIDDEN, f"this token does not belong to job {job!r}")


def new_token() -> str:
    return new_secret("rjt_")


async def resolve_caller(redis: Redis, admin_tokens: str, header: str | None) -> Caller:
    """``admin_tokens``: comma-separated tokens or ``sha256:<hex>`` entries (several during a rotation)."""
    token = bearer(header)
    if TokenSet.parse(admin_tokens).matches(token):
        return Caller(admin=True, job=None)
    job = await job_of_token(redis, token)
    if job is None:
        raise PlatformError(ErrorCode.UNAUTHORIZED, "unknown token")
    return Caller(admin=False, job=job)
