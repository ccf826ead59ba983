"""Prometheus metrics of one API process (its own registry: no import-time globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


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
