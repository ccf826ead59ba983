"""The proxy's Prometheus metrics: the saturation numbers that show a hidden cap before it bites.

With several processes, ``PROMETHEUS_MULTIPROC_DIR`` (set by the parent) makes every process
write its values to files and ``/metrics`` on any process reports the sum over all of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

from services.llm_proxy.tally import Tally
from services.runtime.limits import fd_usage
from services.runtime.redis_pool import Observed

LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 300, 600, 1800)
OVERHEAD_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


@dataclass(frozen=True, slots=True)
class EngineSeries:
    """One engine's labelled children, bound once (``labels()`` takes a lock on every call)."""

    in_flight: Gauge
    latency: Histogram
    prompt_tokens: Counter
    completion_tokens: Counter


class ProxyMetrics:
    """Every series of one process. The call path writes through ``tally`` (``tally.py``): calls,
    tokens, latency, overhead, per-job calls and calls in flight reach ``/metrics`` in bulk."""

    def __init__(self) -> None:
        self._engines: dict[str, EngineSeries] = {}
        self._calls: dict[tuple[str, str, str], Counter] = {}
        self._jobs: dict[str, Counter] = {}
        self.tally = Tally()
        r = self.registry = CollectorRegistry()
        self.in_flight = Gauge(
            "rollout_proxy_calls_in_flight", "Calls in flight per engine", ["engine"], registry=r,
            multiprocess_mode="livesum",
        )  # fmt: skip
        self.calls = Counter("rollout_proxy_calls", "Finished calls", ["engine", "route", "code"], registry=r)
        self.errors = Counter("rollout_proxy_errors", "Error responses by code", ["engine", "code"], registry=r)
        self.latency = Histogram(
            "rollout_proxy_call_seconds", "Call latency seen by the client", ["engine"], buckets=LATENCY_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.tokens = Counter("rollout_proxy_tokens", "Tokens", ["engine", "kind"], registry=r)
        self.overhead = Histogram(
            "rollout_proxy_overhead_seconds", "Proxy-added time (call minus upstream)", buckets=OVERHEAD_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.connect_retries = Counter(
            "rollout_proxy_connect_retries", "Calls tried again because a connect was slow (not failed)", ["engine"],
            registry=r,
        )  # fmt: skip
        self.retries = Counter("rollout_proxy_retries", "Calls retried on another engine", ["engine"], registry=r)
        self.aborts = Counter("rollout_proxy_aborts", "Aborts sent to engines", ["reason"], registry=r)
        # job names are admin-chosen, few and not secret (docs/security.md): fine as a label
        self.job_calls = Counter("rollout_proxy_job_calls", "Data-plane calls by job", ["job"], registry=r)
        self.upstream_connections = Gauge(
            "rollout_proxy_upstream_connections", "Open upstream connections", registry=r, multiprocess_mode="livesum"
        )
        self.redis_pool = Gauge(
            "rollout_redis_pool_connections", "Redis connections held, by state", ["service", "pool", "state"],
            registry=r, multiprocess_mode="livesum",
        )  # fmt: skip
        self.redis_pool_limit = Gauge(
            "rollout_redis_pool_limit", "Most connections a pool opens", ["service", "pool"], registry=r,
            multiprocess_mode="livesum",
        )  # fmt: skip
        self.redis_pool_waits = Gauge(
            "rollout_redis_pool_waits", "Callers that waited for a connection (or whose wait ran out)",
            ["service", "pool", "outcome"], registry=r, multiprocess_mode="livesum",
        )  # fmt: skip
        self.open_fds = Gauge(
            "rollout_proxy_open_fds", "Open file descriptors", registry=r, multiprocess_mode="livesum"
        )
        self.max_fds = Gauge(
            "rollout_proxy_max_fds", "Open-file limit of each process", registry=r, multiprocess_mode="min"
        )
        self.held = Gauge(
            "rollout_proxy_calls_held", "Calls held during a weight update", ["pool"], registry=r,
            multiprocess_mode="livesum",
        )  # fmt: skip
        self.held_total = Counter("rollout_proxy_held_calls", "Calls that were held", ["pool"], registry=r)
        self.queue_depth = Gauge(
            "rollout_proxy_queue_depth", "Calls waiting in the overload queue (every engine saturated)", registry=r,
            multiprocess_mode="livesum",
        )  # fmt: skip
        self.queue_bytes = Gauge(
            "rollout_proxy_queue_bytes", "Request bytes waiting in the overload queue", registry=r,
            multiprocess_mode="livesum",
        )  # fmt: skip
        self.queue_waits = Counter(
            "rollout_proxy_queue_waits", "Calls that met the overload queue, by outcome", ["outcome"], registry=r
        )
        self.queue_wait_seconds = Histogram(
            "rollout_proxy_queue_wait_seconds", "Time calls spent in the overload queue", buckets=LATENCY_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.limit = Gauge(
            "rollout_proxy_limit", "Every limit of one proxy process (0: none); used/limit is saturation", ["limit"],
            registry=r, multiprocess_mode="max",
        )  # fmt: skip
        self.processes = Gauge(
            "rollout_proxy_processes", "Live proxy worker processes", registry=r, multiprocess_mode="livesum"
        )
        self.engine_up = Gauge(
            "rollout_proxy_engine_up", "1 if routable from this process", ["engine"], registry=r,
            multiprocess_mode="min",
        )  # fmt: skip
        self.busy_probes = Counter(
            "rollout_proxy_busy_probes_total", "health probes that timed out on a busy engine (not failures)",
            ["engine"], registry=r,
        )  # fmt: skip
        self.client_connections = Gauge(
            "rollout_proxy_http_connections_open", "Client connections open now", registry=r,
            multiprocess_mode="livesum",
        )  # fmt: skip
        self.client_cuts = Counter(
            "rollout_proxy_http_connections_cut", "Client connections closed for slowness, by phase", ["phase"],
            registry=r,
        )  # fmt: skip
        self.lean_calls = Counter(
            "rollout_proxy_lean_calls", "Data-plane calls read and answered by the proxy's own protocol", registry=r
        )
        self.handed_over = Counter(
            "rollout_proxy_http_connections_handed", "Client connections handed to aiohttp's server (a request the "
            "proxy's own protocol does not take: other routes, streams, chunked bodies)", registry=r,
        )  # fmt: skip
        self.client_timeouts = Gauge(
            "rollout_proxy_http_client_timeout_seconds", "Slow-client limits, by phase", ["phase"], registry=r,
            multiprocess_mode="max",
        )  # fmt: skip
        self.weight_update = Histogram(
            "rollout_proxy_weight_update_seconds", "Weight-update transaction time", ["pool"], buckets=LATENCY_BUCKETS,
            registry=r,
        )  # fmt: skip

    def saturation(self, pool: Observed | None) -> None:
        """Sample the limits that do not count themselves: the Redis pool and open files."""
        used, limit = fd_usage()
        self.open_fds.set(used)
        self.max_fds.set(limit)
        if pool is not None:
            f = pool.figures()
            self.redis_pool.labels("proxy", "commands", "in_use").set(f["in_use"])
            self.redis_pool.labels("proxy", "commands", "idle").set(f["idle"])
            self.redis_pool_limit.labels("proxy", "commands").set(f["limit"])
            self.redis_pool_waits.labels("proxy", "commands", "waited").set(f["waits"])
            self.redis_pool_waits.labels("proxy", "commands", "timed_out").set(f["wait_timeouts"])

    def limits(self, values: dict[str, float]) -> None:
        """Publish this process's limits (``services.llm_proxy.limits``)."""
        self.processes.set(1)
        for name, value in values.items():
            self.limit.labels(name).set(value)

    def engine(self, engine_id: str) -> EngineSeries:
        series = self._engines.get(engine_id)
        if series is None:
            series = self._engines[engine_id] = EngineSeries(
                in_flight=self.in_flight.labels(engine_id),
                latency=self.latency.labels(engine_id),
                prompt_tokens=self.tokens.labels(engine_id, "prompt"),
                completion_tokens=self.tokens.labels(engine_id, "completion"),
            )
        return series

    def call_done(self, engine_id: str, route: str, code: str) -> Counter:
        """The ``calls`` child for one (engine, route, code), bound once."""
        key = (engine_id, route, code)
        child = self._calls.get(key)
        if child is None:
            child = self._calls[key] = self.calls.labels(engine_id, route, code)
        return child

    def job(self, job: str) -> Counter:
        """The ``job_calls`` child for one job, bound once."""
        child = self._jobs.get(job)
        if child is None:
            child = self._jobs[job] = self.job_calls.labels(job)
        return child

    def render(self) -> bytes:
        self.tally.flush()  # this process's own calls are in what it answers
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            merged = CollectorRegistry()
            multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
            return generate_latest(merged)
        return generate_latest(self.registry)
