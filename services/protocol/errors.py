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
    """An error with a code, raised inside a service and turned into an HTTP response.

    Its HTTP status is the code's (``ErrorCode.http_status``): the same code gets the same status
    from every service.
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        field: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s

    @property
    def status(self) -> int:
        return self.code.http_status

    def headers(self) -> dict[str, str]:
        """``Retry-After`` (whole seconds, at least 1) when waiting helps."""
        return {"Retry-After": str(max(1, round(self.retry_after_s)))} if self.retry_after_s else {}

    def body(self) -> ErrorBody:
        return ErrorBody.of(self.code, self.message, field=self.field, retry_after_s=self.retry_after_s)

    def __repr__(self) -> str:
        return f"PlatformError({self.code.value!r}, {self.message!r}, status={self.status})"


__all__ = ["ErrorBody", "ErrorDetail", "PlatformError"]
