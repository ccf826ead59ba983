"""Error and JSON responses of the proxy (every error is an ``ErrorBody`` with an ``ErrorCode``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import orjson
from aiohttp import web

from services.llm_proxy.body import ParsedBody, parse_body
from services.protocol import ErrorCode, PlatformError
from services.protocol.errors import ErrorBody


class CallRequest(Protocol):
    """What the data plane reads of a request: aiohttp's ``web.Request``, or the lean server's
    (``lean_server.py``)."""

    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    async def read(self) -> bytes: ...


def json_response(doc: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(doc), status=status, content_type="application/json", headers=headers)


def error_response(exc: PlatformError, headers: Mapping[str, str] | None = None) -> web.Response:
    return json_response(exc.body().model_dump(mode="json"), exc.status, {**exc.headers(), **(headers or {})})


def error_frame(exc: PlatformError) -> bytes:
    """An SSE frame carrying an error, for failures after a stream has started."""
    return b"data: " + orjson.dumps(ErrorBody.of(exc.code, exc.message).model_dump(mode="json")) + b"\n\n"


async def read_json(request: web.Request) -> dict[str, Any]:
    """The whole body decoded."""
    return (await read_body(request, whole=True)).doc


async def read_body(request: CallRequest, *, whole: bool = False) -> ParsedBody:
    """The body; unless ``whole``, a flat ``input_ids`` array is counted but not decoded (``body.py``)."""
    try:
        return parse_body(await request.read(), whole=whole)
    except orjson.JSONDecodeError as exc:
        raise PlatformError(ErrorCode.BAD_REQUEST, f"the body is not JSON: {exc}") from exc
    except TypeError:
        raise PlatformError(ErrorCode.BAD_REQUEST, "the body must be a JSON object") from None
