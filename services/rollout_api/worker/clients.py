"""What the worker's HTTP clients share (``proxy_client``: the LLM proxy; ``broker_client``: the
sandbox broker): the platform's failure type, the outage hold, and how an error answer is read.

Every failure becomes a typed exception: :class:`InfraError` is the platform's (retried in a fresh
sandbox, never scored); the proxy client adds ``ContextExceeded``, the policy's (a cap).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import orjson

from services.protocol import ErrorCode, InfraStage
from services.rollout_api.worker.outages import Outages, Unreachable

T = TypeVar("T")
JSON_HEADERS = {"Content-Type": "application/json"}


class InfraError(Exception):
    """The platform failed the attempt at ``stage``; ``retryable`` is False for request errors."""

    def __init__(self, stage: InfraStage, code: ErrorCode, message: str, *, retryable: bool = True) -> None:
        super().__init__(f"{stage.value}/{code}: {message}")
        self.stage = stage
        self.code = code
        self.message = message
        self.retryable = retryable

    def at(self, stage: InfraStage, context: str) -> InfraError:
        """The same failure seen at ``stage``: its code and ``retryable`` kept, ``context`` prefixed."""
        return InfraError(stage, self.code, f"{context}: {self.message}", retryable=self.retryable)


def error_code(body: Any, otherwise: ErrorCode) -> ErrorCode:
    """The platform code of an error answer; ``otherwise`` when it carries none (or an unknown one)."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        try:
            return ErrorCode(body["error"].get("code"))
        except ValueError:
            pass
    return otherwise


def parse_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return {"raw": raw[:500].decode(errors="replace")}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


async def held(outages: Outages | None, service: str, stage: InfraStage, send: Callable[[], Awaitable[T]]) -> T:
    """``send()`` through the service's breaker; still unreachable (no breaker, or past the outage
    budget): an infra error."""
    try:
        if outages is None:
            return await send()
        return await outages.call(service, send)
    except Unreachable as exc:
        raise InfraError(stage, ErrorCode.TRANSPORT_ERROR, f"{service} unreachable: {exc}") from exc


def new_session() -> aiohttp.ClientSession:
    """No connection cap (aiohttp's default of 100 is the classic hidden cap); idle < 5 s keep-alive."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0)
    return aiohttp.ClientSession(connector=connector)
