"""HTTP errors of the rollout API, all as ``ErrorBody``."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException

from services.protocol import ErrorBody, ErrorCode, PlatformError

log = logging.getLogger(__name__)

REDIS_RETRY_S = 2.0  # Retry-After while Redis is unreachable
_HTTP_CODES = {401: ErrorCode.UNAUTHORIZED, 403: ErrorCode.FORBIDDEN, 404: ErrorCode.NOT_FOUND}


def error_response(error: PlatformError) -> JSONResponse:
    headers = {"Retry-After": f"{error.retry_after_s:.0f}"} if error.retry_after_s else None
    return JSONResponse(error.body().model_dump(mode="json"), status_code=error.status, headers=headers)


def validation_error(exc: ValidationError | RequestValidationError, *, skip: int = 0) -> PlatformError:
    """422 naming the first offending field (``tasks.0.reward.command``)."""
    first = exc.errors()[0]
    loc = [str(part) for part in first.get("loc", ())][skip:]
    field = ".".join(loc) or None
    return PlatformError(
        ErrorCode.VALIDATION_ERROR, f"{field or 'body'}: {first.get('msg', 'invalid')}", status=422, field=field
    )


def install_error_handlers(app: FastAPI) -> None:
    async def platform(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, PlatformError)
        return error_response(exc)

    async def request_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(validation_error(exc, skip=1))

    async def http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        code = _HTTP_CODES.get(exc.status_code, ErrorCode.BAD_REQUEST)
        return JSONResponse(ErrorBody.of(code, str(exc.detail)).model_dump(mode="json"), status_code=exc.status_code)

    async def redis_away(_: Request, exc: Exception) -> JSONResponse:
        """Redis unreachable (or no pooled connection within the wait): nothing was done; try again."""
        log.warning("Redis unavailable: %r", exc)
        message = "the platform's state store is unavailable; retry shortly"
        return error_response(
            PlatformError(ErrorCode.STORE_UNAVAILABLE, message, status=503, retry_after_s=REDIS_RETRY_S)
        )

    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        body = ErrorBody.of(ErrorCode.INTERNAL_ERROR, "internal error")
        return JSONResponse(body.model_dump(mode="json"), status_code=500)

    app.add_exception_handler(PlatformError, platform)
    app.add_exception_handler(RequestValidationError, request_validation)
    app.add_exception_handler(HTTPException, http)
    app.add_exception_handler(RedisConnectionError, redis_away)
    app.add_exception_handler(RedisTimeoutError, redis_away)
    app.add_exception_handler(Exception, unexpected)
