"""E2B SDK exceptions mapped onto the platform's error codes (infrastructure vs request errors)."""

from __future__ import annotations

from e2b.exceptions import (
    AuthenticationException,
    InvalidArgumentException,
    NotFoundException,
    RateLimitException,
    SandboxNotFoundException,
    SandboxNotRunningException,
    ServiceBusyException,
    TemplateException,
    TimeoutException,
)

from services.protocol.errors import PlatformError
from services.protocol.status import ErrorCode


def is_rate_limit(exc: BaseException) -> bool:
    return isinstance(exc, RateLimitException)


def classify(exc: BaseException, what: str) -> PlatformError:
    """The platform error for an SDK failure during ``what`` (create, exec, read, ...)."""
    if isinstance(exc, PlatformError):
        return exc
    message = f"e2b {what}: {exc}"
    if isinstance(exc, RateLimitException):
        return PlatformError(ErrorCode.CAPACITY_EXHAUSTED, message, retry_after_s=2.0)
    if isinstance(exc, SandboxNotRunningException | SandboxNotFoundException):
        return PlatformError(ErrorCode.SANDBOX_DIED, message)
    if isinstance(exc, TimeoutException):  # also E2B's 502s: the sandbox or its proxy did not answer
        return PlatformError(ErrorCode.TRANSPORT_ERROR, message)
    if isinstance(exc, NotFoundException):
        if what == "read":
            return PlatformError(ErrorCode.NOT_FOUND, message)
        return PlatformError(ErrorCode.SANDBOX_DIED, message)
    if isinstance(exc, TemplateException):
        return PlatformError(ErrorCode.UNKNOWN_TEMPLATE, message, field="template")
    if isinstance(exc, InvalidArgumentException):
        return PlatformError(ErrorCode.BAD_REQUEST, message)
    if isinstance(exc, AuthenticationException | ServiceBusyException):
        return PlatformError(ErrorCode.BACKEND_UNAVAILABLE, message, retry_after_s=5.0)
    if what == "create":
        return PlatformError(ErrorCode.SANDBOX_CREATE_FAILED, message)
    return PlatformError(ErrorCode.TRANSPORT_ERROR, message)
