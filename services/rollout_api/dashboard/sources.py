"""What the dashboard reads from the LLM proxy and the sandbox broker, over HTTP, cached briefly.

Server-side calls carry the tokens from settings (``proxy_admin_token``, ``broker_token``); the
browser never sees them. One answer per source is reused for ``dashboard_cache_s``, so the page's
polling costs the proxy and the broker at most one call per replica per interval.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from services.protocol.dashboard import BrokerView, EngineView, PoolView, SandboxPoolView
from services.rollout_api.dashboard.promtext import Samples, histogram_quantile, parse_metrics
from services.rollout_api.settings import ApiSettings

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Cached(Generic[T]):
    """One value refreshed at most every ``ttl_s``; concurrent readers share one refresh."""

    ttl_s: float
    fetch: Callable[[], Awaitable[T]]
    value: T | None = None
    error: str | None = None
    at: float = -1e18
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def get(self) -> tuple[T | None, str | None]:
        async with self.lock:
            if time.monotonic() - self.at >= self.ttl_s:
                try:
                    self.value, self.error = await self.fetch(), None
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    self.value, self.error = None, f"{type(exc).__name__}: {exc}"
                    log.debug("dashboard source failed: %s", self.error)
                self.at = time.monotonic()
            return self.value, self.error


@dataclass
class ProxyFacts:
    pools: list[PoolView]
    engines: list[EngineView]


def _engine_view(raw: dict[str, Any], version: str | None, metrics: Samples) -> EngineView:
    engine_id = str(raw.get("engine_id") or raw["url"])
    calls = metrics.sum("proxy_calls_total", engine=engine_id)
    return EngineView(
        engine_id=engine_id, pool=str(raw["pool"]), state=str(raw.get("state", "active")),
        ejected=bool(raw.get("ejected")), in_flight=int(raw.get("in_flight", 0)), load=int(raw.get("load", 0)),
        weight_version=raw.get("weight_version") or version, calls=int(calls),
        errors=int(metrics.sum("proxy_errors_total", engine=engine_id)),
        latency_p50_s=histogram_quantile(metrics.buckets("proxy_call_seconds", engine=engine_id), 0.5),
    )  # fmt: skip


def proxy_facts(status: dict[str, Any], metrics: Samples) -> ProxyFacts:
    pools, engines = [], []
    for name, pool in sorted(status["pools"].items()):
        members = pool.get("engines", [])
        pools.append(PoolView(name=name, version=pool.get("version"), updating=bool(pool.get("updating")),
                              engines=len(members)))  # fmt: skip
        engines += [_engine_view(e, pool.get("version"), metrics) for e in members]
    return ProxyFacts(pools=pools, engines=engines)


def broker_view(metrics: Samples) -> BrokerView:
    pools = sorted({labels["pool"] for labels in metrics.labelsets("rollout_broker_pool_size")})
    by_kind = {}
    for labels in metrics.labelsets("rollout_broker_lease_start_seconds_count"):
        key = f"{labels.get('backend', '?')}/{labels.get('kind', '?')}"
        p50 = histogram_quantile(metrics.buckets("rollout_broker_lease_start_seconds", **labels), 0.5)
        if p50 is not None:
            by_kind[key] = p50
    everything = metrics.buckets("rollout_broker_lease_start_seconds")
    return BrokerView(
        leases=int(metrics.sum("rollout_broker_leases")), lease_limit=int(metrics.sum("rollout_broker_lease_limit")),
        admission_waiting=int(metrics.sum("rollout_broker_admission_waiting")),
        lease_p50_s=histogram_quantile(everything, 0.5), lease_p99_s=histogram_quantile(everything, 0.99),
        lease_p50_by_kind=by_kind,
        pools=[SandboxPoolView(pool=p, ready=int(metrics.sum("rollout_broker_pool_size", pool=p)),
                               target=int(metrics.sum("rollout_broker_pool_target", pool=p))) for p in pools],
        errors={lab["code"]: int(metrics.sum("rollout_broker_errors_total", **lab)) for lab in metrics.labelsets(
            "rollout_broker_errors_total")},
    )  # fmt: skip


class FleetSources:
    """The proxy's pools and engines and the broker's figures, each cached for ``ttl_s``."""

    def __init__(self, http: httpx.AsyncClient, settings: ApiSettings) -> None:
        self.http = http
        self.proxy_url = settings.proxy_url.rstrip("/") if settings.proxy_url else None
        self.broker_url = settings.broker_url.rstrip("/") if settings.broker_url else None
        self.proxy_headers = _bearer(settings.proxy_admin_token or settings.admin_token)
        self.broker_headers = _bearer(settings.broker_token or settings.admin_token)
        self.proxy = Cached(settings.dashboard_cache_s, self._fetch_proxy)
        self.broker = Cached(settings.dashboard_cache_s, self._fetch_broker)

    async def _get(self, url: str, headers: dict[str, str]) -> httpx.Response:
        response = await self.http.get(url, headers=headers, timeout=5.0)
        response.raise_for_status()
        return response

    async def _fetch_proxy(self) -> ProxyFacts | None:
        if self.proxy_url is None:
            return None
        status, metrics = await asyncio.gather(
            self._get(self.proxy_url + "/admin/status", self.proxy_headers),
            self._get(self.proxy_url + "/metrics", self.proxy_headers),
        )
        return proxy_facts(status.json(), parse_metrics(metrics.text))

    async def _fetch_broker(self) -> BrokerView | None:
        if self.broker_url is None:
            return None
        response = await self._get(self.broker_url + "/metrics", self.broker_headers)
        return broker_view(parse_metrics(response.text))


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}
