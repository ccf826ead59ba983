"""The one status and failure vocabulary every part of the platform speaks.

A trajectory ends in exactly one :class:`Status`. Task outcomes (a reward, a cap) belong to
the policy and go to the trainer; infrastructure failures are retried and, when retries run
out, are delivered as ``infra_error`` so the trainer can count and drop them. They are never
scored as reward 0.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """How a trajectory ended."""

    COMPLETED = "completed"  # the agent submitted (or stopped) and the reward ran
    TRUNCATED = "truncated"  # a cap cut it; ``Trajectory.truncation`` names which
    INFRA_ERROR = "infra_error"  # the platform failed it; ``Trajectory.infra`` says where
    CANCELLED = "cancelled"  # the user cancelled the rollout

    @property
    def trainable(self) -> bool:
        """Whether a trainer may use the trajectory (completed or truncated)."""
        return self in (Status.COMPLETED, Status.TRUNCATED)


class Cap(StrEnum):
    """The limit that truncated a trajectory."""

    TURNS = "turns"  # agent turn limit (default 80)
    TURN_TOKENS = "turn_tokens"  # one LLM call hit its max_new_tokens
    TRAJECTORY_TOKENS = "trajectory_tokens"  # total tokens of the trajectory (default 65,536)
    CONTEXT_LENGTH = "context_length"  # the proxy answered context_length_exceeded
    WALL_CLOCK = "wall_clock"  # wall-clock budget of the episode
    COMMAND_TIMEOUT = "command_timeout"  # a shell command ran past its timeout


class InfraStage(StrEnum):
    """Where an infrastructure failure happened."""

    SANDBOX_CREATE = "sandbox_create"
    SANDBOX_EXEC = "sandbox_exec"
    LLM = "llm"  # engine down, proxy unreachable, no healthy engine
    LLM_TIMEOUT = "llm_timeout"  # proxy or engine deadline passed
    REWARD = "reward"  # the reward harness itself crashed
    BROKER = "broker"  # the sandbox broker was unreachable or restarted
    WORKER = "worker"  # the worker crashed or was shut down mid-episode


class ErrorCode(StrEnum):
    """Machine-readable error codes of every HTTP error the platform returns.

    Stable: clients switch on them. :data:`INFRA_CODES` says which are infrastructure
    failures (retry elsewhere, never the policy's fault); every other code is a request error.
    """

    # request errors (4xx): the caller must change something
    BAD_REQUEST = "bad_request"
    VALIDATION_ERROR = "validation_error"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    QUOTA_EXCEEDED = "quota_exceeded"
    RATE_LIMITED = "rate_limited"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    UNKNOWN_TEMPLATE = "unknown_template"
    UNKNOWN_POOL = "unknown_pool"
    UNKNOWN_JOB = "unknown_job"
    LEASE_NOT_FOUND = "lease_not_found"
    WARM_MISS = "warm_miss"  # a warm-only lease of a batch found no warm sandbox ready: ask ``POST /leases``
    # infrastructure failures (5xx, or 429/503 from an overloaded backend)
    NO_HEALTHY_ENGINE = "no_healthy_engine"
    ENGINE_ERROR = "engine_error"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    WEIGHT_UPDATE_FAILED = "weight_update_failed"
    SANDBOX_DIED = "sandbox_died"
    SANDBOX_CREATE_FAILED = "sandbox_create_failed"
    TRANSPORT_ERROR = "transport_error"
    BACKEND_UNAVAILABLE = "backend_unavailable"
    CAPACITY_EXHAUSTED = "capacity_exhausted"
    STORE_UNAVAILABLE = "store_unavailable"  # Redis unreachable: nothing was done, retry (503 + Retry-After)
    INTERNAL_ERROR = "internal_error"

    @property
    def infra(self) -> bool:
        """True for infrastructure failures, False for request errors."""
        return self in INFRA_CODES

    @property
    def http_status(self) -> int:
        """The HTTP status every service answers this code with (:data:`HTTP_STATUS`)."""
        return HTTP_STATUS[self]


INFRA_CODES: frozenset[ErrorCode] = frozenset(
    {
        ErrorCode.NO_HEALTHY_ENGINE,
        ErrorCode.ENGINE_ERROR,
        ErrorCode.ENGINE_UNAVAILABLE,
        ErrorCode.UPSTREAM_TIMEOUT,
        ErrorCode.WEIGHT_UPDATE_FAILED,
        ErrorCode.SANDBOX_DIED,
        ErrorCode.SANDBOX_CREATE_FAILED,
        ErrorCode.TRANSPORT_ERROR,
        ErrorCode.BACKEND_UNAVAILABLE,
        ErrorCode.CAPACITY_EXHAUSTED,
        ErrorCode.STORE_UNAVAILABLE,
        ErrorCode.INTERNAL_ERROR,
    }
)


# The one code -> HTTP status map: every service answers a code with this status, whatever raised it.
HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.VALIDATION_ERROR: 422,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.CONFLICT: 409,
    ErrorCode.QUOTA_EXCEEDED: 429,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.CONTEXT_LENGTH_EXCEEDED: 400,  # SGLang's own status for it
    ErrorCode.UNKNOWN_TEMPLATE: 400,
    ErrorCode.UNKNOWN_POOL: 404,
    ErrorCode.UNKNOWN_JOB: 404,
    ErrorCode.LEASE_NOT_FOUND: 404,
    ErrorCode.WARM_MISS: 409,
    ErrorCode.NO_HEALTHY_ENGINE: 503,
    ErrorCode.ENGINE_ERROR: 502,
    ErrorCode.ENGINE_UNAVAILABLE: 503,
    ErrorCode.UPSTREAM_TIMEOUT: 504,
    ErrorCode.WEIGHT_UPDATE_FAILED: 502,
    ErrorCode.SANDBOX_DIED: 410,
    ErrorCode.SANDBOX_CREATE_FAILED: 502,
    ErrorCode.TRANSPORT_ERROR: 502,
    ErrorCode.BACKEND_UNAVAILABLE: 503,
    ErrorCode.CAPACITY_EXHAUSTED: 503,
    ErrorCode.STORE_UNAVAILABLE: 503,
    ErrorCode.INTERNAL_ERROR: 500,
}

# For a status that arrives without a platform code (a framework's 404/405, an engine's 4xx):
# the request-error code that owns it, else BAD_REQUEST.
_CODE_OF_REQUEST_STATUS: dict[int, ErrorCode] = {
    400: ErrorCode.BAD_REQUEST,
    401: ErrorCode.UNAUTHORIZED,
    403: ErrorCode.FORBIDDEN,
    404: ErrorCode.NOT_FOUND,
    409: ErrorCode.CONFLICT,
    413: ErrorCode.PAYLOAD_TOO_LARGE,
    422: ErrorCode.VALIDATION_ERROR,
    429: ErrorCode.RATE_LIMITED,
}


def request_error_code(status: int) -> ErrorCode:
    """The code of a 4xx answer that carried none."""
    return _CODE_OF_REQUEST_STATUS.get(status, ErrorCode.BAD_REQUEST)
