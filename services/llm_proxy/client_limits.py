"""Slow clients cut off on the proxy's connections, its own protocol's (``lean_server.py``) and
aiohttp's (the gateway's streams and the application's routes), as ``services/runtime/slow_clients.py``
does on the uvicorn servers.

- A connection's first request must have all its headers ``http_header_timeout_s`` after the
  connection opened; a later one, ``http_keepalive_s + http_header_timeout_s`` after the previous
  answer (aiohttp itself closes a connection idle for ``http_keepalive_s``).
- A body must have arrived whole ``http_body_timeout_s`` after its headers.

The server's connection callbacks arm a deadline per connection; the middleware sees each request
once its headers are in, disarms it, arms the body's (disarmed at the body's end) and, after the
answer, the next request's. A connection past a deadline is closed without an answer. The time a
handler takes to answer is never limited here (long generations, SSE). A connection of the lean
protocol arms its own (``track``, ``waiting``, ``idle``): a later request's headers are due
``http_header_timeout_s`` after its first byte, and an idle connection is closed, quietly, after
``http_keepalive_s``, as aiohttp closes its own. Counted in
``rollout_proxy_http_connections_open`` and ``rollout_proxy_http_connections_cut_total{phase}``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from services.llm_proxy.metrics import ProxyMetrics
from services.runtime.slow_clients import ClientLimits

log = logging.getLogger(__name__)


class ClientGuard:
    """The deadlines of one server process's connections."""

    def __init__(self, limits: ClientLimits, metrics: ProxyMetrics) -> None:
        self.limits = limits
        self.metrics = metrics
        self._transports: dict[Any, asyncio.Transport] = {}  # request handler (one per connection) -> transport
        self._deadlines: dict[Any, asyncio.TimerHandle] = {}
        for phase, value in (("header", limits.header_timeout_s), ("body", limits.body_timeout_s),
                             ("keepalive", limits.keepalive_s)):  # fmt: skip
            metrics.client_timeouts.labels(phase).set(value)

    def install(self, server: web.Server) -> None:
        """Follow the connections of ``server`` (``AppRunner.server``, once set up)."""
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: Any, transport: asyncio.Transport) -> None:
            made(handler, transport)
            self.track(handler, transport)

        def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
            self.forget(handler)
            lost(handler, exc)

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]

    def track(self, connection: Any, transport: asyncio.Transport) -> None:
        """A new connection: its first request's headers are due ``header_timeout_s`` from now."""
        self._transports[connection] = transport
        self.metrics.client_connections.inc()
        self._arm(connection, "header", self.limits.header_timeout_s)

    def forget(self, connection: Any) -> None:
        """The connection closed, or went to another server's protocol (``lean_server.py``)."""
        self.disarm(connection)
        if self._transports.pop(connection, None) is not None:
            self.metrics.client_connections.dec()

    def waiting(self, connection: Any, phase: str) -> None:
        """A lean connection's request began (``header``) or its headers are in (``body``): that part
        is due within its timeout."""
        self._arm(connection, phase, self.limits.body_timeout_s if phase == "body" else self.limits.header_timeout_s)

    def idle(self, connection: Any) -> None:
        """A lean connection answered: it is closed, quietly, after ``keepalive_s`` with no new request
        (as aiohttp closes its own idle connections)."""
        self._arm(connection, "keepalive", self.limits.keepalive_s)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        connection = self.headers_in(request)
        try:
            return await handler(request)
        finally:
            self.answered(connection)

    def headers_in(self, request: web.Request) -> Any:
        """A request's headers are in: its header deadline is disarmed and its body's armed. Returns its
        connection for :meth:`answered`, or None for a server this guard does not follow (in-process tests)."""
        connection = request.protocol
        if connection not in self._transports:
            return None
        self.disarm(connection)
        if request.body_exists and not request.content.at_eof():
            self._arm(connection, "body", self.limits.body_timeout_s)
            request.content.on_eof(lambda: self.disarm(connection))
        return connection

    def answered(self, connection: Any) -> None:
        """The answer is out: the connection's next request has its headers' deadline."""
        if connection is not None:
            self._arm(connection, "header", self.limits.keepalive_s + self.limits.header_timeout_s)

    def _arm(self, connection: Any, phase: str, after_s: float) -> None:
        self.disarm(connection)
        if connection in self._transports:
            self._deadlines[connection] = asyncio.get_running_loop().call_later(after_s, self._cut, connection, phase)

    def disarm(self, connection: Any) -> None:
        deadline = self._deadlines.pop(connection, None)
        if deadline is not None:
            deadline.cancel()

    def _cut(self, connection: Any, phase: str) -> None:
        self._deadlines.pop(connection, None)
        transport = self._transports.get(connection)
        if transport is None or transport.is_closing():
            return
        if phase == "keepalive":  # an idle keep-alive connection, not a slow client
            transport.close()
            return
        self.metrics.client_cuts.labels(phase).inc()
        log.debug("closed a client connection: its %s took too long", phase)
        transport.close()
