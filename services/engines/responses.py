"""HTTP plumbing shared by the engine's routes: JSON bodies, errors, SSE streams of a generation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from services.engines.batching import Generation
from services.engines.engine import Engine


def json_response(doc: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(doc), status=status, content_type="application/json")


def sglang_error(message: str, status: int = 400) -> web.Response:
    """SGLang's native error body."""
    return json_response({"error": {"message": message}}, status)


def openai_error(message: str, status: int = 400) -> web.Response:
    """SGLang's OpenAI-compatible error body."""
    kind = "BadRequestError" if status < 500 else "InternalServerError"
    return json_response({"object": "error", "message": message, "type": kind, "param": None, "code": status}, status)


async def read_json(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw:
        return {}
    doc = orjson.loads(raw)
    if not isinstance(doc, dict):
        raise ValueError("the request body must be a JSON object")
    return doc


async def wait_done(engine: Engine, gen: Generation) -> None:
    """Wait for the generation; if the caller disconnects (cancellation), drop it from the batch."""
    try:
        await gen.done.wait()
    except asyncio.CancelledError:
        engine.cancel(gen)
        raise


async def stream_sse(
    request: web.Request,
    engine: Engine,
    gen: Generation,
    chunk: Callable[[int, bool], list[dict[str, Any]]],
) -> web.StreamResponse:
    """Send ``data: {...}`` frames as tokens appear and ``data: [DONE]`` at the end.

    ``chunk(sent, final)`` returns the frames for tokens after ``sent``.
    """
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    sent = 0
    try:
        while True:
            gen.progress.clear()
            produced = engine.scheduler.produced(gen)
            final = gen.final_len is not None
            if produced > sent or final:
                for frame in chunk(sent, final):
                    await resp.write(b"data: " + orjson.dumps(frame) + b"\n\n")
                sent = produced
            if final:
                break
            await gen.progress.wait()
        await resp.write(b"data: [DONE]\n\n")
    except (asyncio.CancelledError, ConnectionResetError):
        engine.cancel(gen)
        raise
    await resp.write_eof()
    return resp
