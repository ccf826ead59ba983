"""A request that is not HTTP gets the platform's ``ErrorBody`` (uvicorn answers plain text)."""

from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI

from services.runtime.http_errors import ErrorBodyHttp
from tests.support.http import uvicorn_serving


async def test_a_malformed_request_is_answered_with_an_error_body() -> None:
    async with uvicorn_serving(FastAPI(), ErrorBodyHttp) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /\x00 HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head
    error = json.loads(body)["error"]
    assert error["code"] == "bad_request" and error["message"].startswith("malformed HTTP request")
