"""Prometheus metrics of one API process (its own registry: no import-time globals)."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "rollout_api_requests_total", "HTTP requests by route and status", ["route", "status"],
            registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "rollout_api_request_seconds", "HTTP request latency by route", ["route"], registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )  # fmt: skip
        self.items_queued = Counter(
            "rollout_api_work_items_queued_total", "work items XADDed", ["job"], registry=self.registry
        )
        self.rejected = Counter(
            "rollout_api_rejected_total", "submissions rejected, by error code", ["code"], registry=self.registry
        )
        self.sse_redis_errors = Counter(
            "rollout_api_sse_redis_errors_total", "SSE reads that found Redis away (retried)", registry=self.registry
        )
        self.sse_events = Counter(
            "rollout_api_sse_events_total", "trajectories sent over SSE", ["job"], registry=self.registry
        )

    def observe_http(self, client: httpx.AsyncClient, limit: int) -> None:
        """The HTTP client's pool as saturation gauges: connections in use and idle, and the limit."""
        pool = Gauge("rollout_api_http_pool_connections", "HTTP client connections, by state", ["state"],
                     registry=self.registry)  # fmt: skip
        pool.labels("in_use").set_function(lambda: _http_connections(client, idle=False))
        pool.labels("idle").set_function(lambda: _http_connections(client, idle=True))
        Gauge("rollout_api_http_pool_limit", "Most HTTP client connections", registry=self.registry).set(limit)


def _http_connections(client: httpx.AsyncClient, *, idle: bool) -> int:
    """Counted from httpcore's pool (httpx has no public counter; 0 if its layout changes)."""
    connections: list[Any] = getattr(getattr(getattr(client, "_transport", None), "_pool", None), "connections", [])
    return sum(1 for c in connections if c.is_idle() == idle)
