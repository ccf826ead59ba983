"""The call path's metrics written in bulk: after a flush, ``/metrics`` reads exactly what per-call
writes would have given (counters, histogram buckets and sums, calls in flight per engine)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from services.llm_proxy.metrics import LATENCY_BUCKETS, ProxyMetrics
from services.llm_proxy.tally import Tally

VALUES = [0.0, 0.01, 0.0100001, 0.7, 4.0, 4.2, 599.0, 5000.0, 1e9]  # bucket edges, inside, past the last


def _series(registry: CollectorRegistry) -> tuple[Counter, Histogram]:
    calls = Counter("calls", "calls", ["engine"], registry=registry)
    latency = Histogram("latency", "latency", ["engine"], buckets=LATENCY_BUCKETS, registry=registry)
    return calls, latency


def _text(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_a_flush_writes_what_per_call_writes_would_have() -> None:
    direct, bulk = CollectorRegistry(), CollectorRegistry()
    calls, latency = _series(direct)
    bulk_calls, bulk_latency = _series(bulk)
    tally = Tally()
    for i, value in enumerate(VALUES):
        engine = f"e{i % 2}"
        calls.labels(engine).inc(i)
        latency.labels(engine).observe(value)
        tally.count(bulk_calls.labels(engine), i)
        tally.observe(bulk_latency.labels(engine), value)
    assert _text(bulk) != _text(direct)  # nothing is written before the flush
    tally.flush()
    assert _text(bulk) == _text(direct)
    tally.flush()  # a second flush adds nothing twice
    assert _text(bulk) == _text(direct)


def test_calls_in_flight_are_set_from_the_engines_counts() -> None:
    registry = CollectorRegistry()
    gauge = Gauge("in_flight", "in flight", ["engine"], registry=registry)
    counts = {"a": 3, "b": 1}
    tally = Tally()
    tally.watch_in_flight(lambda: counts, gauge.labels)
    tally.flush()
    assert registry.get_sample_value("in_flight", {"engine": "a"}) == 3
    counts = {"b": 5}  # engine a left the fleet
    tally.flush()
    assert registry.get_sample_value("in_flight", {"engine": "a"}) == 0
    assert registry.get_sample_value("in_flight", {"engine": "b"}) == 5


def test_rendering_flushes_this_processs_calls() -> None:
    metrics = ProxyMetrics()
    metrics.tally.count(metrics.job("job-a"))
    metrics.tally.count(metrics.call_done("e1", "/generate", "200"))
    text = metrics.render().decode()
    assert 'rollout_proxy_job_calls_total{job="job-a"} 1.0' in text
    assert 'rollout_proxy_calls_total{code="200",engine="e1",route="/generate"} 1.0' in text
