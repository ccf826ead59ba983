"""A real aiohttp server on a free loopback port, for tests that need an HTTP peer (an engine,
the proxy, the broker) answering exactly as the test says; and a real uvicorn serving an ASGI app
with a given HTTP protocol class."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from aiohttp import web

from services.runtime.net import free_port


@contextlib.asynccontextmanager
async def serving(*routes: web.RouteDef) -> AsyncIterator[str]:
    """Serve ``routes`` (``web.get(path, handler)``, ...) until the block ends; yields the base URL."""
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def uvicorn_serving(app: Any, http: Any) -> AsyncIterator[int]:
    """Serve the ASGI ``app`` with uvicorn and the HTTP protocol class ``http``; yields the port."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, http=http))
    serving = asyncio.create_task(server.serve())
    try:
        for _ in range(500):  # uvicorn sets ``started`` once it listens
            if server.started:
                break
            await asyncio.sleep(0.02)
        yield port
    finally:
        server.should_exit = server.force_exit = True
        await serving
