"""Typed errors of the rollout API, one class per family of :class:`~services.protocol.status.ErrorCode`.

Every HTTP error the platform returns carries an ``ErrorBody`` with a stable code; the client
raises the class of that code, so a trainer switches on types (``except QuotaExceeded``) or on
``error.code``. An answer without a platform body (a proxy in the way, a bare 502) gets the class
of its HTTP status, ``code`` None.
"""

from __future__ import annotations

from services.protocol.errors import ErrorBody
from services.protocol.status import ErrorCode


class RolloutApiError(Exception):
    """Any error answer of a platform service (the base of every class below)."""

    def __init__(self, status: int, body: ErrorBody | None, text: str) -> None:
        self.status = status
        self.body = body
        detail = f"{body.error.code.value}: {body.error.message}" if body else text[:300]
        super().__init__(f"HTTP {status}: {detail}")

    @property
    def code(self) -> ErrorCode | None:
        return self.body.error.code if self.body else None

    @property
    def infra(self) -> bool:
        """True when retrying later may help (an infrastructure failure)."""
        return self.body.error.infra if self.body else self.status >= 500

    @property
    def retry_after_s(self) -> float | None:
        return self.body.error.retry_after_s if self.body else None

    @property
    def field(self) -> str | None:
        """The offending request field, where the service named one."""
        return self.body.error.field if self.body else None


class BadRequest(RolloutApiError):
    """The request must change (bad_request, validation_error, payload_too_large, unknown_template, ...)."""


class Unauthorized(RolloutApiError):
    """unauthorized (no or a wrong token) and forbidden (a token of another job)."""


class NotFound(RolloutApiError):
    """not_found, unknown_job, unknown_pool, lease_not_found."""


class JobGone(NotFound):
    """The job no longer exists while its trajectories were being read: its trajectory stream or its
    consumer group is gone (the store lost its state, e.g. a Redis restarted without persistence).
    Nothing more will come: create the job again. ``code`` is ``unknown_job``."""


def job_gone(job: str, why: str) -> JobGone:
    """The error for a job found gone while following it (``why``: what showed it)."""
    message = f"job {job!r} no longer exists ({why}): create it again"
    body = ErrorBody.of(ErrorCode.UNKNOWN_JOB, message, field="job")
    return JobGone(404, body, message)


class Conflict(RolloutApiError):
    """conflict (e.g. the pass@k of a rollout that is not an evaluation)."""


class QuotaExceeded(RolloutApiError):
    """quota_exceeded and rate_limited: wait ``retry_after_s`` (when given) and send it again."""


class Unavailable(RolloutApiError):
    """An infrastructure failure (every code of ``INFRA_CODES``): retry later; nothing was done."""


_BY_CODE: dict[ErrorCode, type[RolloutApiError]] = {
    ErrorCode.UNAUTHORIZED: Unauthorized,
    ErrorCode.FORBIDDEN: Unauthorized,
    ErrorCode.NOT_FOUND: NotFound,
    ErrorCode.UNKNOWN_JOB: NotFound,
    ErrorCode.UNKNOWN_POOL: NotFound,
    ErrorCode.LEASE_NOT_FOUND: NotFound,
    ErrorCode.CONFLICT: Conflict,
    ErrorCode.QUOTA_EXCEEDED: QuotaExceeded,
    ErrorCode.RATE_LIMITED: QuotaExceeded,
}
_BY_STATUS: dict[int, type[RolloutApiError]] = {401: Unauthorized, 403: Unauthorized, 404: NotFound,
                                               409: Conflict, 429: QuotaExceeded}  # fmt: skip


def error_class(status: int, code: ErrorCode | None) -> type[RolloutApiError]:
    """The class raised for an answer with ``status`` and (when the body had one) ``code``."""
    if code is not None:
        return Unavailable if code.infra else _BY_CODE.get(code, BadRequest)
    if status >= 500:
        return Unavailable
    return _BY_STATUS.get(status, BadRequest if 400 <= status < 500 else RolloutApiError)


def api_error(status: int, body: ErrorBody | None, text: str) -> RolloutApiError:
    """The typed error for one error answer."""
    return error_class(status, body.error.code if body else None)(status, body, text)
