"""Every error the proxy answers is an ``ErrorBody``: aiohttp's own 404/405/413 and anything unhandled."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from services.llm_proxy.responses import CallRequest, json_response
from services.protocol import ErrorCode
from services.protocol.errors import ErrorBody

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_CODES = {
    401: ErrorCode.UNAUTHORIZED,
    403: ErrorCode.FORBIDDEN,
    404: ErrorCode.NOT_FOUND,
    413: ErrorCode.PAYLOAD_TOO_LARGE,
    429: ErrorCode.RATE_LIMITED,
}


@web.middleware
async def error_bodies(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Exception as exc:
        return answer_error(request, exc)


def answer_error(request: CallRequest, exc: Exception) -> web.Response:
    """The ``ErrorBody`` answer to an exception a handler raised; an ``HTTPException`` below 400 (a
    redirect) is raised again."""
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        code = _CODES.get(exc.status, ErrorCode.BAD_REQUEST if exc.status < 500 else ErrorCode.INTERNAL_ERROR)
        body = ErrorBody.of(code, exc.reason or "error")
        return json_response(body.model_dump(mode="json"), exc.status, _allow(exc))
    log.error("unhandled error on %s %s", request.method, request.path, exc_info=exc)
    return json_response(ErrorBody.of(ErrorCode.INTERNAL_ERROR, "internal error").model_dump(mode="json"), 500)


def _allow(exc: web.HTTPException) -> dict[str, str] | None:
    allow = exc.headers.get("Allow")
    return {"Allow": allow} if allow else None
