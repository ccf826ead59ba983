"""A response's head and body leave in one write (``http_writes.py``), a streamed response still
leaves chunk by chunk, and nothing written is lost when the connection closes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, cast

from fastapi import FastAPI
from starlette.responses import Response, StreamingResponse

from services.runtime.http_writes import BatchedTransport, BatchedWritesHttp
from tests.support.http import uvicorn_serving


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def _batched() -> tuple[BatchedTransport, RecordingTransport]:
    raw = RecordingTransport()
    return BatchedTransport(cast(asyncio.Transport, raw), asyncio.get_running_loop()), raw


async def test_writes_of_one_step_leave_as_one() -> None:
    batched, raw = _batched()
    batched.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    batched.write(b"")
    batched.write(bytearray(b"{}"))
    assert raw.writes == [] and batched.get_write_buffer_size() == 40
    await asyncio.sleep(0)
    assert raw.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    batched.write(b"next step")
    await asyncio.sleep(0)
    assert raw.writes[1:] == [b"next step"]
    assert batched.get_extra_info("peername") == "info:peername"  # the rest is the transport's own


async def test_close_sends_what_was_written_and_abort_drops_it() -> None:
    batched, raw = _batched()
    batched.write(b"last words")
    batched.close()
    assert raw.writes == [b"last words"] and raw.closed
    other, raw2 = _batched()
    other.write(b"never sent")
    other.abort()
    await asyncio.sleep(0)
    assert raw2.writes == [] and raw2.aborted


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/json")
    async def plain() -> dict[str, int]:
        return {"a": 1}

    @app.delete("/gone", status_code=204)
    async def gone() -> Response:
        return Response(status_code=204)

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"data: first\n\n"
            await asyncio.sleep(3600)  # the first chunk must arrive while the stream is still open
            yield b"data: never\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return app


async def _exchange(port: int, request: bytes, until: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    got = b""
    while until not in got:
        chunk = await asyncio.wait_for(reader.read(65536), 30)
        assert chunk, got
        got += chunk
    writer.close()
    return got


async def test_a_real_server_answers_plain_empty_and_streamed_responses() -> None:
    async with uvicorn_serving(_app(), BatchedWritesHttp) as port:
        got: Any = await _exchange(port, b"GET /json HTTP/1.1\r\nHost: x\r\n\r\n", b"}")
        assert got.startswith(b"HTTP/1.1 200") and json.loads(got.partition(b"\r\n\r\n")[2]) == {"a": 1}
        got = await _exchange(port, b"DELETE /gone HTTP/1.1\r\nHost: x\r\n\r\n", b"\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 204")
        got = await _exchange(port, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", b"data: first")
        assert got.startswith(b"HTTP/1.1 200") and b"never" not in got
