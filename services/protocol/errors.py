"""The body of every HTTP error response: ``{"error": {...}}``."""

from __future__ import annotations

from pydantic import BaseModel

from services.protocol.status import ErrorCode


class ErrorDetail(BaseModel):
    code: ErrorCode  # machine-readable, stable
    message: str  # for people
    infra: bool  # True: infrastructure failure (retry elsewhere); False: fix the request
    field: str | None = None  # the offending request field, where there is one
    retry_after_s: float | None = None  # set on 429/503 where waiting helps


class ErrorBody(BaseModel):
    error: ErrorDetail

    @classmethod
    def of(
        cls,
        code: ErrorCode,
        message: str,
        *,
        field: str | None = None,
        retry_after_s: float | None = None,
    ) -> ErrorBody:
        return cls(
            error=ErrorDetail(code=code, message=message, infra=code.infra, field=field, retry_after_s=retry_after_s)
        )


class PlatformError(Exception):
    """An error with a code, raised inside a service and turned into an HTTP response."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        status: int = 400,
        field: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.field = field
        self.retry_after_s = retry_after_s

    def body(self) -> ErrorBody:
        return ErrorBody.of(self.code, self.message, field=self.field, retry_after_s=self.retry_after_s)

    def __repr__(self) -> str:
        return f"PlatformError({self.code.value!r}, {self.message!r}, status={self.status})"


__all__ = ["ErrorBody", "ErrorDetail", "PlatformError"]
