"""The error answers of every FastAPI service (the rollout API, the sandbox broker), installed once.

Every error is an ``ErrorBody`` whose HTTP status is its code's (``ErrorCode.http_status``):

- ``PlatformError``: its code, message and field; ``Retry-After`` when it says how long to wait;
- a request that fails validation: 422 ``validation_error`` naming the first offending field;
- a framework ``HTTPException`` (unknown route 404, wrong method 405): its status, the code that
  owns it;
- Redis unreachable, timing out, read-only or loading (or no pooled connection within the wait):
  503 ``store_unavailable`` with ``Retry-After``; nothing was done, the caller retries;
- anything else: 500 ``internal_error``, logged with its traceback. No exception text is ever sent;
- a request that is not HTTP at all (uvicorn's own 400 before any route): :class:`ErrorBodyHttp`
  answers it with an ``ErrorBody`` too (``bad_request``), when passed as uvicorn's ``http``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from services.protocol import ErrorBody, ErrorCode, PlatformError
from services.protocol.status import request_error_code
from services.runtime.outages import STORE_ERRORS, Outage

log = logging.getLogger(__name__)

STORE_RETRY_S = 2.0  # Retry-After while Redis is unreachable

OnError = Callable[[ErrorCode], None]  # e.g. a per-code error counter


def error_response(error: PlatformError) -> JSONResponse:
    return JSONResponse(error.body().model_dump(mode="json"), status_code=error.status, headers=error.headers())


def validation_error(exc: ValidationError | RequestValidationError, *, skip: int = 0) -> PlatformError:
    """422 naming the first offending field (``tasks.0.reward.command``); ``skip`` drops "body"."""
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(part) for part in first.get("loc", ())][skip:]
    field = ".".join(loc) or None
    return PlatformError(ErrorCode.VALIDATION_ERROR, f"{field or 'body'}: {first.get('msg', 'invalid')}", field=field)


def store_unavailable() -> PlatformError:
    message = "the platform's state store is unavailable; retry shortly"
    return PlatformError(ErrorCode.STORE_UNAVAILABLE, message, retry_after_s=STORE_RETRY_S)


def install_error_handlers(app: FastAPI, on_error: OnError | None = None) -> None:
    """Answer every error of ``app`` as an ``ErrorBody``; ``on_error`` sees each code answered."""
    count = on_error or (lambda code: None)
    redis = Outage("Redis", log)  # logged once per outage, however many requests fail during it

    async def platform(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, PlatformError)
        count(exc.code)
        return error_response(exc)

    async def request_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return await platform(_, validation_error(exc, skip=1))

    async def http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        code = request_error_code(exc.status_code)
        count(code)
        body = ErrorBody.of(code, str(exc.detail)).model_dump(mode="json")
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    async def store_away(request: Request, exc: Exception) -> JSONResponse:
        redis.failed(exc)
        return await platform(request, store_unavailable())

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return await platform(request, PlatformError(ErrorCode.INTERNAL_ERROR, "internal error"))

    app.add_exception_handler(PlatformError, platform)
    app.add_exception_handler(RequestValidationError, request_validation)
    app.add_exception_handler(HTTPException, http)
    for kind in STORE_ERRORS:
        app.add_exception_handler(kind, store_away)
    app.add_exception_handler(Exception, unexpected)


class ErrorBodyHttp(HttpToolsProtocol):
    """uvicorn's HTTP protocol whose answer to a malformed request is the platform's ``ErrorBody``
    (uvicorn writes plain text there): ``uvicorn.run(app, http=ErrorBodyHttp)``."""

    def send_400_response(self, msg: str) -> None:
        body = ErrorBody.of(ErrorCode.BAD_REQUEST, f"malformed HTTP request: {msg}").model_dump_json().encode()
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        head += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body),
                 b"connection: close\r\n\r\n"]  # fmt: skip
        self.transport.write(b"".join(head) + body)
        self.transport.close()
