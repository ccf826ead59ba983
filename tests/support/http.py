"""A real aiohttp server on a free loopback port, for tests that need an HTTP peer (an engine,
the proxy, the broker) answering exactly as the test says."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

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
