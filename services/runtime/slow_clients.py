"""Slow clients are cut off: a connection holds a socket and a task only while its client keeps pace.

Each connection of a uvicorn server (the API, the broker) gets three limits, all settings:

- ``header_timeout_s``: from the connection's first byte wanted (its opening, or the start of the
  next request on a kept-alive one) to the end of the request's headers;
- ``body_timeout_s``: from the end of the headers to the end of the body (the whole body, so a
  body sent a byte at a time is cut too);
- ``keepalive_s``: how long a connection may sit idle between requests (uvicorn's own timer).

A connection past a limit is closed without an answer (its client has stopped sending; an answer
could only wait on it too). The time the application takes to answer is never limited here: a
long poll or an SSE stream is not a slow client. ``ConnectionCollector`` exports, per server
process, the connections open, the connections cut by phase (``header``, ``body``, ``idle``) and the
limits themselves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)
PHASES = ("header", "body", "idle")


@dataclass(frozen=True, slots=True)
class ClientLimits:
    header_timeout_s: float
    body_timeout_s: float
    keepalive_s: float


@dataclass(slots=True)
class ConnectionStats:
    """One server process's connections (kept by its protocol instances, read by ``/metrics``)."""

    open: int = 0
    cut: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PHASES, 0))


def guarded(base: type[HttpToolsProtocol], limits: ClientLimits, stats: ConnectionStats) -> type[HttpToolsProtocol]:
    """``base`` (uvicorn's httptools protocol or a subclass) with the limits above, counted in ``stats``."""

    class Guarded(base):  # type: ignore[valid-type,misc]
        # The phase under a limit now (None: between requests) and when it ends, in loop time. One
        # timer per connection checks it, set again only when it fires early or a sooner end comes:
        # a request on a kept-alive connection moves the end along without a timer of its own.
        _phase: str | None = None
        _due: float = 0.0
        _timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            stats.open += 1
            self._arm("header", limits.header_timeout_s)

        def connection_lost(self, exc: Exception | None) -> None:
            self._phase = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            stats.open -= 1
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._phase is None:  # the next request of a kept-alive connection
                self._arm("header", limits.header_timeout_s)

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._arm("body", limits.body_timeout_s)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._phase = None

        def timeout_keep_alive_handler(self) -> None:
            if not self.transport.is_closing():
                stats.cut["idle"] += 1
            super().timeout_keep_alive_handler()

        def _arm(self, phase: str, after_s: float) -> None:
            self._phase = phase
            self._due = self.loop.time() + after_s
            timer = self._timer
            if timer is not None and timer.when() <= self._due:
                return  # it fires first, and checks again
            if timer is not None:
                timer.cancel()
            self._timer = self.loop.call_at(self._due, self._check)

        def _check(self) -> None:
            self._timer = None
            if self._phase is None:
                return
            if self.loop.time() < self._due:
                self._timer = self.loop.call_at(self._due, self._check)
                return
            self._cut(self._phase)

        def _cut(self, phase: str) -> None:
            self._phase = None
            if self.transport.is_closing():
                return
            stats.cut[phase] += 1
            log.debug("closed a connection from %s: its %s took too long", self.client, phase)
            self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


def uvicorn_options(base: type[HttpToolsProtocol], limits: ClientLimits, stats: ConnectionStats) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.Config`` that apply the limits."""
    return {"http": guarded(base, limits, stats), "timeout_keep_alive": limits.keepalive_s}


class ConnectionCollector(Collector):
    """``<prefix>_http_connections_open``, ``<prefix>_http_connections_cut_total{phase}`` and
    ``<prefix>_http_client_timeout_seconds{phase}`` of one server process."""

    def __init__(self, prefix: str, limits: ClientLimits, stats: ConnectionStats) -> None:
        self.prefix, self.limits, self.stats = prefix, limits, stats

    def collect(self) -> Iterator[Metric]:
        p = self.prefix
        yield GaugeMetricFamily(f"{p}_http_connections_open", "client connections open now", value=self.stats.open)
        cut = CounterMetricFamily(f"{p}_http_connections_cut", "client connections closed for slowness, by phase",
                                  labels=["phase"])  # fmt: skip
        for phase in PHASES:
            cut.add_metric([phase], self.stats.cut[phase])
        yield cut
        limit = GaugeMetricFamily(f"{p}_http_client_timeout_seconds", "slow-client limits, by phase", labels=["phase"])
        for phase, value in zip(PHASES, (self.limits.header_timeout_s, self.limits.body_timeout_s,
                                         self.limits.keepalive_s), strict=True):  # fmt: skip
            limit.add_metric([phase], value)
        yield limit
