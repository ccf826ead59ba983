"""What the dashboard reads from the proxy's and the broker's real metric registries."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from services.llm_proxy.metrics import ProxyMetrics
from services.rollout_api.dashboard.promtext import histogram_quantile, parse_metrics
from services.rollout_api.dashboard.sources import broker_view, proxy_facts
from services.rollout_api.dashboard.summaries import Summary, _Turn, staleness
from services.sandbox_broker.metrics import BrokerMetrics


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = [(1.0, 10.0), (2.0, 20.0), (4.0, 40.0), (float("inf"), 40.0)]
    assert histogram_quantile(buckets, 0.5) == pytest.approx(2.0)
    assert histogram_quantile(buckets, 0.75) == pytest.approx(3.0)
    assert histogram_quantile(buckets, 0.1) == pytest.approx(0.4)
    assert histogram_quantile([(1.0, 0.0), (float("inf"), 5.0)], 0.5) == 1.0  # beyond the last finite bound
    assert histogram_quantile([], 0.5) is None and histogram_quantile([(1.0, 0.0)], 0.5) is None


def test_broker_figures_from_its_registry() -> None:
    m = BrokerMetrics()
    m.pool_size.labels("default").set(3)
    m.pool_target.labels("default").set(8)
    for seconds in (0.004, 0.004, 0.004, 2.0):
        m.lease_start.labels("local", "warm" if seconds < 1 else "cold").observe(seconds)
    m.leases.set(5)
    m.lease_limit.set(100)
    m.queue.set(2)
    m.errors.labels("capacity").inc(3)
    view = broker_view(parse_metrics(generate_latest(m.registry).decode()))
    assert (view.leases, view.lease_limit, view.admission_waiting) == (5, 100, 2)
    assert [(p.pool, p.ready, p.target) for p in view.pools] == [("default", 3, 8)]
    assert view.lease_p50_s is not None and 0.0025 <= view.lease_p50_s <= 0.005
    assert view.lease_p99_s is not None and 1.0 <= view.lease_p99_s <= 2.5
    assert set(view.lease_p50_by_kind) == {"local/warm", "local/cold"}
    assert view.errors == {"capacity": 3}


def test_proxy_figures_from_its_status_and_registry() -> None:
    m = ProxyMetrics()
    m.call_done("e1:1", "/generate", "200").inc(7)
    m.errors.labels("e1:1", "engine_error").inc(2)
    m.engine("e1:1").latency.observe(0.3)
    status = {"pools": {"default": {"name": "default", "version": "4", "updating": False, "engines": [
        {"url": "http://e1:1", "pool": "default", "state": "active", "engine_id": "e1:1", "ejected": False,
         "in_flight": 3, "load": 5, "weight_version": "4"}]}}}  # fmt: skip
    facts = proxy_facts(status, parse_metrics(generate_latest(m.registry).decode()))
    assert [(p.name, p.version, p.engines) for p in facts.pools] == [("default", "4", 1)]
    engine = facts.engines[0]
    assert (engine.engine_id, engine.in_flight, engine.load, engine.calls, engine.errors) == ("e1:1", 3, 5, 7, 2)
    assert engine.weight_version == "4" and engine.latency_p50_s is not None


def test_staleness_counts_versions_behind_the_pool() -> None:
    def consumed(*versions: str) -> Summary:
        return Summary("t", 1, "r", "task", "completed", turns=[_Turn(v) for v in versions])

    found = staleness("5", [consumed("5"), consumed("3", "4"), consumed("4"), consumed("lora")])
    assert (found.sampled, found.max, found.histogram) == (3, 2, {"0": 1, "1": 1, "2": 1})
    assert found.mean == pytest.approx(1.0)
    assert staleness("default", [consumed("1")]).sampled == 0
