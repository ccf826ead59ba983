"""Bearer tokens: the admin token (settings) creates jobs; a job token reaches only its own job.

Job tokens are stored as SHA-256 hashes (``keys.job_tokens``); the plain token is shown once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from services.protocol import ErrorCode, PlatformError, keys


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
    return "rjt_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def bearer(header: str | None) -> str:
    if not header or not header.lower().startswith("bearer ") or not header[7:].strip():
        raise PlatformError(ErrorCode.UNAUTHORIZED, "missing bearer token")
    return header[7:].strip()


async def resolve_caller(redis: Redis, admin_token: str, header: str | None) -> Caller:
    token = bearer(header)
    if admin_token and hmac.compare_digest(token.encode(), admin_token.encode()):
        return Caller(admin=True, job=None)
    job: Any = await redis.hget(keys.job_tokens(), hash_token(token))
    if job is None:
        raise PlatformError(ErrorCode.UNAUTHORIZED, "unknown token")
    return Caller(admin=False, job=job.decode() if isinstance(job, bytes) else str(job))
